"""Attention backend choice: a pure query over declared capabilities (no CUDA needed)."""

from __future__ import annotations

import logging

import pytest
import torch

from score_batch.choices import BACKENDS
from score_batch.engine.attention.base import Workload
from score_batch.engine.attention.registry import BACKEND_CLASSES, choose_backend, select_backend
from score_batch.engine.errors import SettingError

MISSING_REQUESTS = "ModuleNotFoundError: No module named 'requests'"


def need(device="cuda", dtype=torch.bfloat16, head_dim=128, softcap=False, sliding_window=False, pack=8192):
    return Workload(device, dtype, head_dim, softcap, sliding_window, pack)


def importable(module):
    return None


def missing(module):
    return MISSING_REQUESTS


def never_imported(module):
    raise AssertionError(f"{module} must not be imported for this choice")


def test_every_registered_backend_is_a_config_choice_with_capabilities():
    assert BACKENDS == ("auto", *BACKEND_CLASSES)
    for name, cls in BACKEND_CLASSES.items():
        assert cls.name == name and cls.capabilities.devices


def test_cpu_auto_keeps_split_without_importing_flashinfer():
    for dtype in (torch.float32, torch.bfloat16):
        name, why = choose_backend("auto", need("cpu", dtype), never_imported)
        assert name == "split"
        assert "flashinfer does not run on cpu" in why


@pytest.mark.parametrize(
    "workload, import_error, chosen, reason",
    [
        (need(), importable, "flashinfer", "first choice"),
        (need(dtype=torch.float16, head_dim=64), importable, "flashinfer", "first choice"),
        (need(dtype=torch.float32), never_imported, "flex", "not float32"),
        (need(head_dim=32), never_imported, "flex", "this model has 32"),
        (need(softcap=True), never_imported, "flex", "soft-capping"),
        (need(sliding_window=True), never_imported, "flex", "sliding windows"),
        (need(pack=100_000), never_imported, "flex", "max_pack_tokens"),
        (need(), missing, "flex", "flashinfer cannot import flashinfer (" + MISSING_REQUESTS),
    ],
)
def test_cuda_auto_takes_the_first_backend_that_fits_and_says_why(workload, import_error, chosen, reason):
    name, why = choose_backend("auto", workload, import_error)
    assert name == chosen
    assert reason in why


@pytest.mark.parametrize(
    "workload, import_error, reason",
    [
        (need(), missing, "cannot import flashinfer (" + MISSING_REQUESTS),
        (
            need(dtype=torch.float32),
            importable,
            "needs EngineConfig.dtype in (bfloat16, float16), not float32",
        ),
        (need(head_dim=96), importable, "needs a head_dim in [64, 128, 256]; this model has 96"),
        (need(softcap=True), importable, "soft-capping"),
        (need(sliding_window=True), importable, "sliding windows"),
        (need("cpu"), importable, "does not run on cpu"),
    ],
)
def test_explicit_flashinfer_that_cannot_run_is_a_setting_error(workload, import_error, reason):
    with pytest.raises(SettingError, match="EngineConfig.backend='flashinfer'") as error:
        choose_backend("flashinfer", workload, import_error)
    assert reason in str(error.value)
    assert error.value.setting == "EngineConfig.backend"


def test_explicit_backends_that_fit_are_kept():
    assert choose_backend("flex", need("cpu", torch.float32), never_imported)[0] == "flex"
    assert choose_backend("sdpa", need(dtype=torch.float32), never_imported)[0] == "sdpa"
    assert choose_backend("flashinfer", need(), importable)[0] == "flashinfer"


LOGGER = "score_batch.engine.attention.registry"


def test_auto_logs_its_choice_once_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert select_backend("auto", need("cpu", torch.float32), never_imported) == "split"
    records = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelno for r in records] == [logging.DEBUG]
    assert "attention backend split: flashinfer does not run on cpu" in records[0].getMessage()


def test_explicit_choice_is_logged_at_debug(caplog):
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert select_backend("sdpa", need("cpu", torch.float32), never_imported) == "sdpa"
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER] == [
        (logging.DEBUG, "attention backend sdpa: asked for")
    ]


def test_a_fitting_backend_that_fails_to_import_is_a_warning(caplog):
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert select_backend("auto", need(), missing) == "flex"
    records = [r for r in caplog.records if r.name == LOGGER]
    assert [r.levelno for r in records] == [logging.WARNING]
    assert records[0].getMessage() == (
        f"attention backend flex: could not use flashinfer (cannot import flashinfer: {MISSING_REQUESTS})"
    )


def test_a_backend_passed_over_by_design_is_no_warning(caplog):
    # float32 on CUDA: flashinfer's kernels are 16-bit only, so flex is the expected choice.
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert select_backend("auto", need(dtype=torch.float32), missing) == "flex"
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.DEBUG]
