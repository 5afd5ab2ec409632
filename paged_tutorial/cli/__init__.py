"""The command line, ``paged-tutorial`` (or ``python -m paged_tutorial``), one concern a module:

``main`` (what runs, every exit status), ``ctrl_c`` (Ctrl-C from the first instant),
``options`` (the parser: nothing heavy is imported before the arguments are parsed),
``prompts`` (prompts from arguments, files and standard input), ``streams`` (standard output
for the answer, standard error that may fail), ``startup`` (backend, model and engine),
``timing`` (the figures after each answer), ``answers`` (one-shot prompts, text or JSON) and
``chat`` (the interactive conversation).  ``serve`` is the server's own command line.
"""
