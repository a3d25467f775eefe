"""course: what the chapters call.

``chapter`` (parameters, outputs, recorded GPU data), ``exercises`` (checks that explain a wrong answer),
``quantities`` (answers read as numbers with units), ``bank/`` (each chapter's exercises, and ``check``), ``lab``
(``make lab``'s plain copies of the chapters),
``hf_configs`` (the shipped config.json files), ``report`` (papermill runs with a cache), ``pages`` and ``render``
(offline HTML pages and the index, written atomically), ``provenance`` (the one builder of where a number was made).
"""
