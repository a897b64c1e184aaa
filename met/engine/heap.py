"""The Python heap after boot: collect boot's garbage and freeze the rest, so the cyclic collector skips it.

A serve or a benchmark loads the model, the tokenizer, torch and its modules once: hundreds of
thousands of long-lived objects. Each of the cyclic collector's full (generation 2) passes scans
every one of them, and a step's allocations (the host n-gram index's tuples, a plan's records)
trigger such passes: on the 2-core Xeon one took 90-120 ms, longer than six width-16 steps
(`python3 benchmarks/studies/gc_pause.py`). `gc.freeze()` moves every object alive now into a permanent
generation the passes never scan; what serving allocates is collected as before.
"""

import gc


def settle() -> int:
    """Collect what boot left unreachable, then freeze the survivors; returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
