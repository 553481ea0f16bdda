"""Attention backends by name, in `auto`'s order of preference, and the choice of one for a workload."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

import torch

from score_batch.engine.attention.base import AttentionBackend, Workload
from score_batch.engine.attention.flashinfer import FlashInferBackend
from score_batch.engine.attention.flashinfer_two_phase import FlashInferTwoPhaseBackend
from score_batch.engine.attention.flex import FlexBackend
from score_batch.engine.attention.sdpa import SdpaBackend
from score_batch.engine.attention.split import SplitBackend
from score_batch.engine.errors import SettingError

log = logging.getLogger(__name__)

BACKEND_CLASSES: dict[str, type[AttentionBackend]] = {
    cls.name: cls
    for cls in (FlashInferBackend, FlashInferTwoPhaseBackend, FlexBackend, SplitBackend, SdpaBackend)
}

# The backends auto races against the one it picked, at load on CUDA where each fits and is proven
# (engine/model/setup.py's prove_setup, proof.faster): the faster on the model's widths is kept. Empty until a
# GPU run measures the two-phase form faster at the goal shape: today auto keeps the multi-item mask path.
AUTO_RIVALS: dict[str, tuple[str, ...]] = {"flashinfer": ()}


def import_failure(module: str) -> str | None:
    """The error text of importing module, or None when it imports."""
    try:
        importlib.import_module(module)
    except Exception as error:  # a broken install raises more than ImportError; its text is the reason
        return f"{type(error).__name__}: {error}"
    return None


def why_not(
    name: str, need: Workload, import_error: Callable[[str], str | None], auto: bool = False
) -> str | None:
    """Why backend `name` cannot run the workload (capabilities, then auto's devices, then its import), or None."""
    caps = BACKEND_CLASSES[name].capabilities
    reason = caps.why_not(need)
    if reason is None and auto and need.device not in caps.auto_devices:
        reason = f"is not picked automatically on {need.device}"
    if reason is None and caps.module is not None:
        failure = import_error(caps.module)
        if failure is not None:
            reason = f"cannot import {caps.module} ({failure})"
    return reason


def choose_backend(
    requested: str, need: Workload, import_error: Callable[[str], str | None] = import_failure
) -> tuple[str, str]:
    """(backend name, why): an explicit name that cannot run raises SettingError; auto takes the first that can."""
    if requested != "auto":
        reason = why_not(requested, need, import_error)
        if reason is not None:
            raise SettingError("EngineConfig.backend", requested, reason)
        return requested, "asked for"
    skipped = []
    for name in BACKEND_CLASSES:
        reason = why_not(name, need, import_error, auto=True)
        if reason is None:
            return name, "; ".join(skipped) or "first choice"
        skipped.append(f"{name} {reason}")
    raise SettingError("EngineConfig.backend", requested, "found no backend: " + "; ".join(skipped))


def broken_before(
    chosen: str, need: Workload, import_error: Callable[[str], str | None] = import_failure
) -> list[str]:
    """The backends auto prefers to `chosen` that fit the workload but failed to import (a broken install)."""
    broken = []
    for name in BACKEND_CLASSES:
        if name == chosen:
            break
        caps = BACKEND_CLASSES[name].capabilities
        if caps.why_not(need) is None and need.device in caps.auto_devices and caps.module is not None:
            failure = import_error(caps.module)
            if failure is not None:
                broken.append(f"{name} (cannot import {caps.module}: {failure})")
    return broken


def select_backend(
    requested: str, need: Workload, import_error: Callable[[str], str | None] = import_failure
) -> str:
    """choose_backend, logged once: at DEBUG, or WARNING when auto had to pass over a backend that failed to import."""
    name, why = choose_backend(requested, need, import_error)
    broken = broken_before(name, need, import_error) if requested == "auto" else []
    if broken:
        log.warning("attention backend %s: could not use %s", name, "; ".join(broken))
    else:
        log.debug("attention backend %s: %s", name, why)
    return name


def make_backend(name: str, device: torch.device) -> AttentionBackend:
    """Instantiate a registered backend for a device."""
    return BACKEND_CLASSES[name](device)
