-- issue 15: table.move over 2^53 slots looped in C
table.move({}, 1, 1 << 53, 1)
local t = setmetatable({}, { __len = function() return math.maxinteger end })
table.insert(t, 1, 'x')
