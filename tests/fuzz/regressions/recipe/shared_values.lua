-- issue 15: 1 MiB of Lua shared by 2000 keys became 2 GB of JSON
local s = string.rep('x', 1 << 20)
local t = {}
for i = 1, 2000 do t[i] = s end
local a = {}
for i = 1, 25 do a = { a, a } end
return { junk = t, more = a }
