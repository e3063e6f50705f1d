"""Drop-in recorders for the trainers people already use.

Each is at most two added lines in the user's code and imports its framework
only when its module is imported (``import gpudash`` never does)::

    from gpudash.integrations.hf import GpudashCallback          # transformers.Trainer
    trainer = Trainer(..., callbacks=[GpudashCallback("runs/x")])

    from gpudash.integrations.lightning import GpudashCallback   # lightning.pytorch
    trainer = L.Trainer(..., callbacks=[GpudashCallback("runs/x")])
"""

from __future__ import annotations

__all__: list[str] = []
