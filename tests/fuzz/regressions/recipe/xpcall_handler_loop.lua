-- issue 15: Lua runs an xpcall message handler with hooks off; this looped forever
xpcall(function() while true do end end, function() while true do end end)
