"""The CANN sparse-mode explorer: the mask the operator applies, its tiles, and its rejections.

Every picture is the operator's own rule: the calls of :func:`flashlab.cann.plan` (the planner
:func:`flashlab.cann.flash_attention_score` and its grad run through) and the mask of
:func:`flashlab.cann.sparse_mode_mask`; each call's tiles are classified by the kernel's
:func:`flashlab.masks.classify_tiles` from the call's band and dense mask. Arguments the
device refuses show the planner's ``ValueError`` message, which names the device's check.
"""
from __future__ import annotations

import warnings

import numpy as np

from flashlab.arguments import as_int
from flashlab.cann import INT32_MAX, Dims, plan, sparse_mode_mask
from flashlab.cann.sparse_modes import SPARSE_MODES, compressed_mask, prefix_mask
from flashlab.cann.varlen import sequences
from flashlab.masks import EMPTY, FULL, allowed, classify_tiles
from flashlab.widgets.explorer import Control, Explorer

__all__ = ["GRID_LENGTHS", "GRID_TOKENS", "GRID_PREFIX", "GRID_TILES", "TOKEN_MODES",
           "PREFIX_MODES", "mode_arguments", "SparseModeExplorer"]

#: Sq and Sk the static sparse-mode explorer offers (issue 33)
GRID_LENGTHS = (8, 12, 20)
#: pre_tokens and next_tokens it offers (INT32_MAX is the operator's default, no limit)
GRID_TOKENS = (-2, 0, 3, 8, INT32_MAX)
#: prefix lengths it offers (modes 5, 6)
GRID_PREFIX = (0, 4, 10)
#: tile sizes it offers
GRID_TILES = (4, 8)
#: the modes that read pre_tokens/next_tokens
TOKEN_MODES = (0, 4, 7, 8)
#: the modes that read the prefix
PREFIX_MODES = (5, 6)


def mode_arguments(mode: int, sq: int, sk: int, pre_tokens: int = INT32_MAX,
                   next_tokens: int = INT32_MAX, prefix: int = 0) -> dict:
    """Keyword arguments of :func:`flashlab.cann.sparse_mode_mask` for ``mode`` as a user of
    the operator passes them (the atten_mask the mode requires):

    - 0: a full atten_mask consistent with ``pre_tokens``/``next_tokens`` (everything outside
      the band masked), as the operator requires;
    - 1: a full atten_mask of two packed documents (block-diagonal); pre/next not passed;
    - 2, 3: the compressed 2048 x 2048 triangle; 4: the same with pre/next;
    - 5: the full prefix mask and ``prefix=[prefix]``; 6: the compressed 3072 x 2048 mask;
    - 7, 8: TND: ``sq`` and ``sk`` each split into two packed sequences, the compressed
      triangle, pre/next.
    """
    if mode == 0:
        return {"atten_mask": ~allowed(sq, sk, pre_tokens, next_tokens),
                "pre_tokens": pre_tokens, "next_tokens": next_tokens}
    if mode == 1:
        docs = np.ones((sq, sk), dtype=np.bool_)
        docs[: sq // 2, : sk // 2] = False
        docs[sq // 2:, sk // 2:] = False
        return {"atten_mask": docs}
    if mode in (2, 3):
        return {"atten_mask": compressed_mask(mode)}
    if mode == 4:
        return {"atten_mask": compressed_mask(4), "pre_tokens": pre_tokens,
                "next_tokens": next_tokens}
    if mode == 5:
        return {"atten_mask": prefix_mask(sq, sk, prefix)[None, None], "prefix": [prefix]}
    if mode == 6:
        return {"atten_mask": compressed_mask(6), "prefix": [prefix]}
    return {"atten_mask": compressed_mask(mode), "pre_tokens": pre_tokens,
            "next_tokens": next_tokens, "actual_seq_qlen": [sq // 2, sq],
            "actual_seq_kvlen": [sk // 2, sk]}


class SparseModeExplorer(Explorer):
    """Every CANN ``sparse_mode`` (0-8) on a small ``Sq x Sk`` problem: one explorer, live and static.

    Controls: the mode, ``Sq``, ``Sk``, ``pre_tokens``, ``next_tokens`` (modes 0, 4, 7, 8),
    the prefix length (modes 5, 6) and the tile size. The picture: the entries the operator
    allows (white) and masks (grey), the tiles of each kernel call in their class's colour
    (skipped ones dashed), and for the TND modes 7 and 8 the sequence boundaries. Arguments the
    device refuses show its message instead. The static page offers :data:`GRID_LENGTHS`,
    :data:`GRID_TOKENS`, :data:`GRID_PREFIX` and :data:`GRID_TILES`; a live kernel any value.
    """

    kind = "sparse"
    title = "CANN sparse_mode explorer: the mask the operator applies, its tiles, its rejections"
    notebook = "masks"
    controls = (
        Control("sparse_mode", "sparse_mode", tuple(range(9))),
        Control("sq", "Sq", GRID_LENGTHS, {"min": 1, "max": 48}),
        Control("sk", "Sk", GRID_LENGTHS, {"min": 1, "max": 48}),
        Control("pre_tokens", "pre_tokens", GRID_TOKENS, {"min": -48, "max": 48}),
        Control("next_tokens", "next_tokens", GRID_TOKENS, {"min": -48, "max": 48}),
        Control("prefix", "prefix", GRID_PREFIX, {"min": 0, "max": 48}),
        Control("block", "tile", GRID_TILES, {"min": 1, "max": 16}),
    )
    defaults = {"sparse_mode": 4, "sq": 12, "sk": 20, "pre_tokens": 8, "next_tokens": 0,
                "prefix": 4, "block": 4}

    def __init__(self, sparse_mode: int = 4, sq: int = 12, sk: int = 20, pre_tokens: int = 8,
                 next_tokens: int = 0, prefix: int = 4, block: int = 4) -> None:
        super().__init__(sparse_mode=sparse_mode, sq=sq, sk=sk, pre_tokens=pre_tokens,
                         next_tokens=next_tokens, prefix=prefix, block=block)

    def relevant(self, values: dict) -> dict:
        """pre/next_tokens matter for :data:`TOKEN_MODES` only, the prefix for :data:`PREFIX_MODES`."""
        drop: set[str] = set()
        if values["sparse_mode"] not in TOKEN_MODES:
            drop |= {"pre_tokens", "next_tokens"}
        if values["sparse_mode"] not in PREFIX_MODES:
            drop.add("prefix")
        return {k: v for k, v in values.items() if k not in drop}

    def state(self, values: dict) -> dict:
        """The operator's mask and tiles for ``values``, or its rejection."""
        mode = as_int("sparse_mode", values["sparse_mode"], lo=0, hi=8, what="an int in 0..8")
        sq = as_int("sq", values["sq"], lo=1, hi=48, what="an int in [1, 48]")
        sk = as_int("sk", values["sk"], lo=1, hi=48, what="an int in [1, 48]")
        block = as_int("block", values["block"], lo=1, hi=16, what="an int in [1, 16]")
        uses_tokens, uses_prefix = mode in TOKEN_MODES, mode in PREFIX_MODES
        pre = as_int("pre_tokens", values["pre_tokens"]) if uses_tokens else INT32_MAX
        nxt = as_int("next_tokens", values["next_tokens"]) if uses_tokens else INT32_MAX
        prefix = as_int("prefix", values["prefix"], lo=0) if uses_prefix else 0
        off = ([] if uses_tokens else ["pre_tokens", "next_tokens"]) + ([] if uses_prefix else ["prefix"])
        info = SPARSE_MODES[mode]
        passed = [f"Sq={sq}", f"Sk={sk}"]
        if uses_tokens:
            passed += [f"pre_tokens={pre}", f"next_tokens={nxt}"]
        if uses_prefix:
            passed.append(f"prefix=[{prefix}]")
        head = f"sparse_mode {mode} ({info.name}): allowed {info.rule}"
        kwargs = mode_arguments(mode, sq, sk, pre, nxt, prefix)
        varlen = "actual_seq_qlen" in kwargs
        if varlen:
            passed.append(f"TND, q ends {kwargs['actual_seq_qlen']}, kv ends {kwargs['actual_seq_kvlen']}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                ok = sparse_mode_mask(sq, sk, mode, **kwargs)
                dims = Dims(1, 1, 1, sq, sk, 1, 1)
                seqs = None
                if varlen:
                    dims.B = 0
                    seqs = sequences(kwargs["actual_seq_qlen"], kwargs["actual_seq_kvlen"], dims)
                calls = plan(dims, sparse_mode=mode, seqs=seqs,
                             **{k: v for k, v in kwargs.items() if not k.startswith("actual_")})
            except ValueError as exc:
                return {"error": 1, "off": off,
                        "text": [head, ", ".join(passed), f"the operator refuses: {exc}"]}
        tiles = []
        for c in calls:
            r0, c0 = (c.q_rows.start, c.kv_rows.start) if varlen else (0, 0)
            n_q = (c.q_rows.stop - c.q_rows.start) if varlen else sq
            n_k = (c.kv_rows.stop - c.kv_rows.start) if varlen else sk
            if n_q == 0 or n_k == 0:
                continue
            cls = classify_tiles(n_q, n_k, block, block, c.left, c.right,
                                 None if c.mask is None else c.mask[0, 0])
            for a in range(cls.shape[0]):
                for b in range(cls.shape[1]):
                    tiles.append([r0 + a * block, r0 + min((a + 1) * block, n_q),
                                  c0 + b * block, c0 + min((b + 1) * block, n_k), int(cls[a, b])])
        n = len(tiles)
        empty = sum(t[4] == EMPTY for t in tiles)
        full = sum(t[4] == FULL for t in tiles)
        text = [head, ", ".join(passed),
                f"{len(calls)} kernel call(s), {n} tiles of {block} x {block}: {n - empty} computed "
                f"({full} full, {n - empty - full} partial), {empty} skipped; "
                f"{int(ok.sum())} of {sq * sk} scores allowed"]
        text += [f"the device warns: {w.message}" for w in caught]
        rows = ["".join("1" if a else "0" for a in row) for row in ok]
        state = {"sq": sq, "sk": sk, "mask": self.pooled(rows), "tiles": tiles, "off": off,
                 "text": text}
        if varlen:
            state["qends"] = kwargs["actual_seq_qlen"][:-1]
            state["kends"] = kwargs["actual_seq_kvlen"][:-1]
        return state
