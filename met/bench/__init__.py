"""`met bench`: measuring what speculation costs on this box, and the table files it writes."""
