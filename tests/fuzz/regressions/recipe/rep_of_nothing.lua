-- issue 15: string.rep of an empty string looped 2^63 times in C
local s = string.rep('', math.maxinteger) .. ('').rep('', 1 << 62, '')
return { junk = s }
