"""The names and limits met's commands offer as choices and defaults, in a module that imports nothing.

Typer builds every command's options when `met` starts (for `met --help` too), so the values an
option's default or help shows must be importable without the modules that own them: those load
torch (the recipes, the engine), fastapi and uvicorn (the server). These are copies of the owners'
values; tests/test_choices.py checks each equals its owner's, so a change there fails until it is
made here too.
"""

DEFAULT_RECIPE = "met-tiny-py"  # met.model.recipes.DEFAULT_RECIPE: the embedded recipe a command runs by default
RUN_DTYPES = ("float32", "bfloat16", "float16", "float64")  # met.engine.identity.RUN_DTYPES
MAX_THREADS = 1024  # met.engine.identity.MAX_THREADS
SPEC_MODES = ("off", "mtp", "draft", "ngram", "prompt-lookup", "dflash", "eagle")  # met.engine.proposer.SPEC_MODES (generate --spec)
NGRAM_MAX = 4  # met.engine.proposer.NGRAM_MAX: the longest suffix the n-gram proposers match
SERVE_SPECS = ("off", "mtp", "draft", "mtp+draft", "eagle", "mtp+eagle", "draft+eagle", "mtp+draft+eagle", "ngram",
               "prompt-lookup", "dflash")  # met.engine.policy (serve --spec)
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # met.serve.server.LOG_LEVELS (uvicorn's)
ENERGY_CHOICES = ("auto", "nvml", "rapl", "none")  # met.bench.meters.ENERGY_CHOICES
POLICIES = ("off", "fixed-1", "fixed-2", "fixed-3", "fixed-4", "static", "prompt-lookup", "measured")  # bench policies
# met.bench.policies.OPTIONAL_POLICIES: run only when named (the draft-* ones also by default with --draft-model, the
# eagle-* ones with --eagle)
OPTIONAL_POLICIES = ("dflash", "draft-fixed-1", "draft-fixed-2", "draft-fixed-3", "draft-fixed-4", "draft-measured",
                     "mtp+draft-measured", "eagle-fixed-1", "eagle-fixed-2", "eagle-fixed-3", "eagle-fixed-4",
                     "eagle-measured", "mtp+eagle-measured", "draft+eagle-measured", "mtp+draft+eagle-measured")
