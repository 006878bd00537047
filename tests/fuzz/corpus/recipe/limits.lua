local s = string.rep("ab", 1000, ",")
local t = setmetatable({}, { __index = function(t, k) return k end })
local i = 0
while i < 100 do i = i + 1 end
return { model = t[1], junk = { s, s, s }, optimizer = k3.none }
