"""course: what the chapters call.

``chapter`` (parameters, outputs, recorded GPU data), ``exercises`` (checks that explain a wrong answer),
``quantities`` (answers read as numbers with units), ``bank/`` (each chapter's exercises, and ``check``), ``lab``
(``make lab``'s plain copies of the chapters),
``hf_configs`` (the shipped config.json files), ``report`` (papermill runs with a cache), ``book`` (the executed
chapters as a Sphinx + myst-nb book, offline), ``booksearch`` (its search with excerpts from disk), ``glossary``
and ``bibliography`` (the book's one glossary and one reference list, linked from the chapters), ``figures``
(labels and legends checked for overlap when a figure is saved), ``pages`` (scrubbed machine paths, atomic
writes), ``provenance`` (the one builder of where a number was made).
"""
