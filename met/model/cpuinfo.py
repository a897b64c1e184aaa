"""What /proc/cpuinfo says about this CPU: its model name for the box class, its vendor for the kernel rule.

Beside it, where sysfs lists cpu0's caches: met.engine.identity names the last-level one in the device name.

Read in one place so that the box class (met.engine.identity) and the matrix kernels
(met.model.packed) agree on the file and its format; where there is no such file (not Linux, a
sandbox) every field reads as "".
"""

from collections.abc import Iterable
from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")
CPU_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")  # index*/level and index*/size, one folder per cache


def cpuinfo_field(keys: Iterable[str], path: Path = CPUINFO) -> str:
    """The first non-empty value of any of these keys ("model name", "vendor_id"), or "" where none is."""
    wanted = set(keys)
    try:
        for line in path.read_text(errors="replace").splitlines():
            if line.split(":")[0].strip() in wanted:
                value = line.partition(":")[2].strip()
                if value:
                    return value
    except OSError:
        pass
    return ""
