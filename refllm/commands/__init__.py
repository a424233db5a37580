"""The pieces of the ``refllm`` command line that more than one command uses, and the commands of their own.

``refllm.cli`` builds the parser and runs a command; these modules sit under it:
``common`` opens and loads models, ``flags`` checks flags before anything loads,
``answer`` streams an answer and its stats line, ``chat`` is the interactive chat,
and ``models`` adds ``list``, ``rm`` and ``warmup``.
"""
