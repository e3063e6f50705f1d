"""One module per ``gpudash`` subcommand, named after it (``import-snapshot`` is ``import_snapshot``).

Each exposes ``add_arguments(parser)`` and ``run(args) -> int``; :mod:`gpudash.cli` imports only the
one that runs. Commands are the top of the house: they may import any layer, nothing imports them.
"""
