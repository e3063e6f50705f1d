"""``gpudash run -- COMMAND``: record an unchanged training script.

``gpudash.commands.run`` is the subcommand (it starts the script), ``agent`` what runs
inside the script's process, ``_boot/sitecustomize.py`` what loads the agent.
"""

from __future__ import annotations

__all__: list[str] = []
