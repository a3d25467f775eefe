"""course: what the chapters call. ``chapter`` (parameters, outputs, recorded GPU data), ``exercises`` (checks that
explain a wrong answer), ``report`` (papermill runs with a cache), ``render`` (offline HTML pages and the index),
``hf_configs`` (the shipped HF ``config.json`` files)."""
