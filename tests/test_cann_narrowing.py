"""The explicit checks that narrow the CANN modules' Optional fields (issue #21: mypy without
suppression): a misuse fails with a ValueError naming what is missing, not an AttributeError
or TypeError on None deep inside."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from flashlab.cann.plan import Call
from flashlab.cann.pse import Pse, check_alibi_cover


def test_tnd_seq_is_the_sequence_index_of_a_tnd_call():
    c = Call(slice(3, 7), slice(2, 9), 0, 0, None, seq=2)
    assert c.tnd_seq == 2


def test_tnd_seq_refuses_a_call_not_planned_for_tnd():
    c = Call(slice(0, 2), slice(0, 2), 0, 0, None)
    with pytest.raises(ValueError, match="no TND sequence index"):
        _ = c.tnd_seq


def test_check_alibi_cover_refuses_an_uncompressed_pse():
    p = Pse(1, (1, 1, 4, 4), np.dtype(np.float32), bias=np.zeros((1, 1, 4, 4), np.float32))
    c = Call(slice(0, 1), slice(0, 1), 0, 0, None)
    with pytest.raises(ValueError, match="compressed"):
        check_alibi_cover(p, c, SimpleNamespace(varlen=False))  # the check comes before st is read
