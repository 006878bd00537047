-- issue 15: a backtracking pattern ran for hours in one C call
return { junk = string.find(string.rep('a', 4000), string.rep('a*', 12) .. 'b') }
