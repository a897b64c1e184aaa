"""The exit statuses met's commands end with (the BSD sysexits.h values, so scripts can tell them apart)."""

EX_OK = 0
"""Success: the command did what it was asked."""

EX_DATAERR = 65
"""The input was read but is invalid: a malformed table or calibration."""

EX_NOINPUT = 66
"""An input file does not exist or cannot be read."""

EX_UNAVAILABLE = 69
"""A service the command was asked to use is unavailable (an energy source that does not work here)."""

EX_SOFTWARE = 70
"""An internal error: the engine broke one of its own guarantees (greedy outputs that differ by policy)."""

EX_CANTCREAT = 73
"""An output file could not be written."""

EX_IOERR = 74
"""The command's output (stdout) could not be written: a full disk, a device error."""

EX_TEMPFAIL = 75
"""Temporary failure, try again later: another run holds the lock."""

EX_CONFIG = 78
"""A configuration mismatch: a table or calibration measured under another key than this box's."""

EX_INTERRUPTED = 130
"""Interrupted by Ctrl-C (SIGINT): 128 + the signal's number, as shells report it."""
