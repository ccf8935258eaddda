"""The warnings torch gives about APIs detectron2 and torchvision's detectors call, silenced for the detection job
and for each training process detectron2's launch spawns (neither module imports the other for it)."""

from __future__ import annotations

import logging
import warnings


def quiet_torch_notices() -> None:
    """torch's notices about APIs detectron2 and torchvision's detectors call (jit.script at import, meshgrid, fx
    tracing): not the user's to act on; verbose=true shows them."""
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated")
    warnings.filterwarnings("ignore", message=r"torch\.meshgrid: in an upcoming release")
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
