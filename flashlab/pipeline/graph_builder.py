"""The tasks of one core's FlashAttention tile loop, stage by stage (:class:`FAGraphBuilder`)."""
from __future__ import annotations

from typing import cast

from flashlab.pipeline.buffers import FAShape, cuts, work_chunks
from flashlab.pipeline.durations import Durations
from flashlab.pipeline.params import CoreModel, Engine
from flashlab.pipeline.program import Program, cube_order

__all__ = ["FAGraphBuilder"]


class FAGraphBuilder:
    """The tasks of one core's tile loop, stage by stage, collected in a ``Program``.

    :func:`~flashlab.pipeline.schedule.build_fa_graph` runs the stages in this order (each
    engine's program order is the order its tasks are added):

    1. the loads: :func:`~flashlab.pipeline.loads.iterate_all_loads` or
       :func:`~flashlab.pipeline.loads.own_mte2_loads` call :meth:`load_q`, :meth:`load_k`,
       :meth:`load_v`, :meth:`load_p` in MTE2's program order;
    2. :meth:`cube_stage`: per matmul of :func:`~flashlab.pipeline.program.cube_order`, MTE1 and
       Cube chunks (:meth:`bmm1` $S = Q K^T$, :meth:`bmm2` $O_{part} = P V$), the release of its L1
       buffers (:meth:`free_l1`) and the FixPipe write-back (:meth:`fixpipe`);
    3. :meth:`vector_stage`: the online softmax (:meth:`softmax`, :meth:`rescale`,
       :meth:`finish`) and the MTE3 write-backs (:meth:`store_p`, :meth:`store_o`);
    4. :meth:`pools`: the buffer slots the tasks acquire.

    Task keys: ``("Q", i, part)``, ``("K", t, part)``, ``("V", t)``, ``("Pin", t)`` (MTE2),
    ``("M1", kind, t, w)`` (MTE1), ``("MM", kind, t, w)`` (Cube), ``("FX", kind, t)``
    (FixPipe), ``("SM", t)``, ``("RS", t)``, ``("FIN", i)`` (Vector), ``("Pout", t)``,
    ``("OUT", i)`` (MTE3), with ``kind`` ``"QK"`` or ``"PV"``, ``w`` the chunk and ``part`` 0
    (nope, or all of $d_{qk}$) or 1 (rope).
    """

    def __init__(self, core: CoreModel, shape: FAShape, strategy: str, n_buffers: int, *,
                 lookahead: int, base_k: int, kv_source: str, softmax_ops: float,
                 rescale_ops: float):
        self.core, self.shape, self.strategy, self.n_buffers = core, shape, strategy, n_buffers
        self.base_k, self.softmax_ops, self.rescale_ops = base_k, softmax_ops, rescale_ops
        self.cost = Durations(core, kv_source)
        self.gm = core.exchange == "gm"
        self.db, self.ab, self.dv = shape.dtype_bytes, shape.acc_bytes, shape.d_v_eff
        # steps t = (q-block i, kv-block j), i-major; the Cube's order of the 2T matmuls
        self.rows, self.cols = shape.q_rows, shape.kv_cols
        self.steps = [(i, j) for i in range(len(self.rows)) for j in range(len(self.cols))]
        self.last_of_block = {i * len(self.cols) + len(self.cols) - 1 for i in range(len(self.rows))}
        self.corder = cube_order(len(self.steps), lookahead)
        # QK^T reduction parts: (d_qk,) or (d_qk - r, r), named "" and "r" in task labels
        self.parts = shape.qk_parts
        self.part_names = ("", "r") if len(self.parts) == 2 else ("",)
        self.E_LOAD, self.E_MTE1 = core.load.name, (core.l1_to_l0.name if core.l1_to_l0 else None)
        self.E_MM, self.E_FIX = core.matmul.name, (core.acc_out.name if core.acc_out else None)
        self.E_VEC, self.E_STORE = core.vector.name, core.store.name
        self.prog = Program(tuple(e for e in (self.E_LOAD, self.E_MTE1, self.E_MM, self.E_FIX,
                                               self.E_VEC, self.E_STORE) if e))

    def chunks(self, k: int) -> list[int]:
        """The L0 chunks of a reduction axis of length ``k``: ``base_k`` columns each."""
        return cuts(k, self.base_k)

    def last_mm(self, kind: str, t: int) -> tuple:
        """Key of the last Cube task of matmul ``(kind, t)``."""
        if kind == "QK":
            n_work = work_chunks(self.parts, self.base_k)
        else:
            n_work = len(self.chunks(self.cols[self.steps[t][1]]))
        return ("MM", kind, t, n_work - 1)

    # ---- loads: GM -> L1 on MTE2 ------------------------------------------------------------
    def load_q(self, t: int, only: int | None = None) -> None:
        """$Q_i$ (``rows x d`` per part, ``dtype_bytes`` each) HBM -> L1, into L1's one Q
        buffer; ``only`` the part ``only`` (split RoPE under ``IterateAll``)."""
        i = self.steps[t][0]
        self._load_parts("Q", i, self.rows[i], self.cost.hbm, "L1.Q", "load_q", t, only)

    def load_k(self, t: int, only: int | None = None) -> None:
        """$K_j$ (``cols x d`` per part) HBM or L2 -> an L1 B buffer."""
        j = self.steps[t][1]
        self._load_parts("K", t, self.cols[j], self.cost.kv, "L1.B", "load_k", t, only)

    def _load_parts(self, letter: str, index: int, rows: int, source, buffer: str, kind: str,
                    t: int, only: int | None) -> None:
        """One MTE2 load per part of a Q or K tile (``rows x d`` of each part: NoPE, then RoPE
        when split): only part 0 takes the L1 ``buffer`` (the parts share it); a RoPE part is
        of kind ``load_rope``; ``only`` loads the part ``only`` alone."""
        for p, (d, nm) in enumerate(zip(self.parts, self.part_names)):
            if only is None or p == only:
                self.prog.add((letter, index, p), self.E_LOAD, f"{letter}{nm}{index}",
                              self.cost.move(self.core.load, rows * d * self.db, source),
                              acquire=buffer if p == 0 else None,
                              kind=kind if p == 0 else "load_rope", step=t)

    def load_v(self, t: int) -> None:
        """$V_j$ (``cols x d_v_eff``: padded to $d_{qk}$ with ``pad_v``) HBM or L2 -> an L1 B
        buffer."""
        j = self.steps[t][1]
        self.prog.add(("V", t), self.E_LOAD, f"V{t}",
                      self.cost.move(self.core.load, self.cols[j] * self.dv * self.db, self.cost.kv),
                      acquire="L1.B", kind="load_v", step=t)

    def load_p(self, t: int) -> None:
        """$P$ (``rows x cols``, fp16) GM workspace -> an L1 A buffer, after MTE3 wrote it
        (Ascend only: the vector cores hand $P$ to the cube core through GM)."""
        i, j = self.steps[t]
        self.prog.add(("Pin", t), self.E_LOAD, f"P{t}",
                      self.cost.move(self.core.load, self.rows[i] * self.cols[j] * self.db,
                                     self.cost.workspace),
                      [("Pout", t)], acquire="L1.A", kind="load_p", step=t)

    # ---- Cube: MTE1 L1 -> L0A / L0B, then the matrix unit into L0C --------------------------
    def cube_stage(self) -> None:
        """MTE1, Cube and FixPipe in the Cube's order: per matmul its chunks, the release of
        its L1 buffers, and (Ascend) its accumulator L0C -> GM."""
        for kind, t in self.corder:
            first, last, last_read = self.bmm1(t) if kind == "QK" else self.bmm2(t)
            self.free_l1(kind, t, last, last_read)
            if self.gm:
                self.fixpipe(kind, t, first, last)

    def bmm1(self, t: int) -> tuple:
        """$S = Q_i K_j^T$ (``rows x cols``), $2 \\cdot rows \\cdot cols \\cdot d_{qk}$ FLOPs:
        with split RoPE two accumulated products $Q_{nope} K_{nope}^T + Q_{rope} K_{rope}^T$,
        each in ``base_k`` chunks of the reduction axis."""
        j = self.steps[t][1]
        # S = sum over parts and chunks of Q[:, chunk] K[:, chunk]^T, accumulated in L0C
        work = [(p, c, kc) for p, d in enumerate(self.parts) for c, kc in enumerate(self.chunks(d))]
        return self._matmul("QK", t, work, b_rows=self.cols[j], out_n=self.cols[j])

    def bmm2(self, t: int) -> tuple:
        """$O_{part} = P V_j$ (``rows x d_v_eff``), $2 \\cdot rows \\cdot cols \\cdot d_v$ FLOPs
        ($d_{qk}$ with ``pad_v``), in ``base_k`` chunks of the keys."""
        j = self.steps[t][1]
        # O_part = sum over chunks of P[:, chunk] V[chunk, :]
        work = [(0, c, kc) for c, kc in enumerate(self.chunks(self.cols[j]))]
        return self._matmul("PV", t, work, b_rows=self.dv, out_n=self.dv)

    def operands(self, kind: str, t: int, p: int) -> list:
        """Keys of the tasks whose tiles chunk ``p`` of matmul ``(kind, t)`` reads: the L1
        copies of $Q_i, K_j$ or of $V_j$ and $P$ ($P$ from the softmax's registers on a GPU,
        where $PV$ also waits for the previous q-block's $O$ to be read out)."""
        i, j = self.steps[t]
        if kind == "QK":
            return [("Q", i, p), ("K", t, p)]
        data = [("V", t)] + ([("Pin", t)] if self.gm else [("SM", t)])
        if not self.gm and j == 0 and i > 0:
            data.append(("FIN", i - 1))  # the O registers are read out before reuse
        return data

    def _matmul(self, kind: str, t: int, work: list, b_rows: int, out_n: int) -> tuple:
        """One MTE1 copy and one Cube task per chunk ``(part, c, kc)`` of ``work``; returns the
        keys ``(first Cube task, last Cube task, last MTE1 copy or None)``."""
        i, j = self.steps[t]
        m = self.rows[i]
        first_key = last_key = last_read = None
        for w, (p, c, kc) in enumerate(work):
            label = f"{kind}{self.part_names[p] if kind == 'QK' else ''}{t}.{c}"
            task_kind = "rope" if (kind == "QK" and p == 1) else kind.lower()
            data = self.operands(kind, t, p)
            mm_deps = list(data)
            if self.E_MTE1:
                # the A chunk (Q or P, m x kc) and the B chunk (K or V, b_rows x kc): L1 -> L0A / L0B
                a_bytes = 0 if (kind == "PV" and not self.gm) else m * kc * self.db
                nbytes = a_bytes + b_rows * kc * self.db
                l1_to_l0 = cast(Engine, self.core.l1_to_l0)   # set: this core has an MTE1
                mte1 = self.prog.add(("M1", kind, t, w), self.E_MTE1, label,
                                     self.cost.move(l1_to_l0, nbytes, l1_to_l0.rate.value),
                                     data, acquire="L0", kind=task_kind, step=t)
                mm_deps = [mte1]
                last_read = mte1
            # the first chunk takes an L0C accumulator; each chunk frees its L0A/L0B buffer
            key = self.prog.add(("MM", kind, t, w), self.E_MM, label, self.cost.matmul(m, out_n, kc),
                                mm_deps, acquire="L0C" if (self.gm and w == 0) else None,
                                releases=[("M1", kind, t, w)] if self.E_MTE1 else [],
                                kind=task_kind, step=t)
            if first_key is None:
                first_key = key
            last_key = key
        return first_key, last_key, last_read

    def free_l1(self, kind: str, t: int, last_key: tuple, last_read: tuple | None) -> None:
        """Release the L1 buffers of matmul ``(kind, t)`` ($K_j$; $V_j$ and $P$; $Q_i$ after
        the q-block's last $QK^T$) after their last read."""
        i, j = self.steps[t]
        # the L1 buffers of this matmul's tiles are free again after their last read: with
        # IterateAll when the API returns (the Cube finished), with own L1 management as soon
        # as MTE1 has copied the last chunk to L0 (the Cube works from L0)
        rel: list[tuple] = [("K", t, 0)] if kind == "QK" else [("V", t)] + ([("Pin", t)] if self.gm else [])
        if kind == "QK" and j == len(self.cols) - 1:
            rel.append(("Q", i, 0))
        frees = last_key if (self.strategy == "iterate_all" or last_read is None) else last_read
        self.prog.spec[frees]["releases"] += tuple(rel)

    # ---- write-back: FixPipe L0C -> GM, MTE3 UB -> GM ---------------------------------------
    def fixpipe(self, kind: str, t: int, first_key: tuple, last_key: tuple) -> None:
        """$S$ or $O_{part}$ (``rows x cols`` or ``rows x d_v_eff``, fp32) L0C -> GM workspace
        on FixPipe, after the matmul's last chunk; frees its L0C accumulator."""
        m = self.rows[self.steps[t][0]]
        out_n = self.cols[self.steps[t][1]] if kind == "QK" else self.dv
        out_bytes = m * out_n * self.ab
        # write-back is called only for a core with a FixPipe (acc_out set)
        self.prog.add(("FX", kind, t), cast(str, self.E_FIX), f"{'S' if kind == 'QK' else 'O'}{t}",
                      self.cost.move(cast(Engine, self.core.acc_out), out_bytes, self.cost.workspace), [last_key],
                      releases=[first_key], kind=kind.lower(), step=t)

    def store_p(self, t: int) -> None:
        """$P$ (``rows x cols``, fp16) UB -> GM workspace on MTE3, for the cube core's $PV$."""
        i, j = self.steps[t]
        m, n = self.rows[i], self.cols[j]
        self.prog.add(("Pout", t), self.E_STORE, f"P{t}",
                      self.cost.move(self.core.store, m * n * self.db, self.cost.workspace),
                      [("SM", t)], kind="load_p", step=t)

    def store_o(self, t: int) -> None:
        """The q-block's output $O_i$ (``rows x d_v_eff``) UB (registers) -> GM on MTE3."""
        i = self.steps[t][0]
        m = self.rows[i]
        self.prog.add(("OUT", i), self.E_STORE, f"O{i}",
                      self.cost.move(self.core.store, m * self.dv * self.db, self.core.store.rate.value),
                      [("FIN", i)], kind="store_o", step=t)

    # ---- Vector: the online softmax ---------------------------------------------------------
    def vector_stage(self) -> None:
        """The Vector's program (and MTE3's) in the Cube's order: the softmax after each
        $QK^T$, the rescale after each $PV$, the final division after a q-block's last $PV$."""
        for kind, t in self.corder:
            if kind == "QK":
                self.softmax(t)
                if self.gm:
                    self.store_p(t)
            else:
                if self.gm:
                    self.rescale(t)
                if t in self.last_of_block:
                    self.finish(t)
                    self.store_o(t)

    def softmax(self, t: int) -> None:
        """The online softmax of step ``t`` on ``rows x cols`` scores: ``softmax_ops``
        operations and one exponential per score, one exponential per row; on Ascend it reads
        $S$ (fp32) from the workspace, on a GPU it also rescales $O$ in its registers."""
        i, j = self.steps[t]
        m, n = self.rows[i], self.cols[j]
        if self.gm:
            # m_new = max(m, rowmax(S)); P = exp(S - m_new); l = e^{m - m_new} l + rowsum(P)
            self.prog.add(("SM", t), self.E_VEC, f"softmax{t}",
                          self.cost.vector(m * n * self.softmax_ops, m * n + m, read=m * n * self.ab),
                          [("FX", "QK", t)], kind="softmax", step=t)
        else:
            # same, and O <- e^{m - m_new} O in place: it must wait for the previous PV
            deps = [self.last_mm("QK", t)] + ([self.last_mm("PV", t - 1)] if j > 0 else [])
            self.prog.add(("SM", t), self.E_VEC, f"softmax{t}",
                          self.cost.vector(m * n * self.softmax_ops + m * self.dv, m * n + m), deps,
                          kind="softmax", step=t)

    def rescale(self, t: int) -> None:
        """$O \\leftarrow e^{m - m_{new}} O + O_{part}$ on ``rows x d_v_eff`` elements
        (``rescale_ops`` each), reading $O_{part}$ (fp32) from the workspace (Ascend)."""
        m = self.rows[self.steps[t][0]]
        # O <- e^{m - m_new} O + O_part
        self.prog.add(("RS", t), self.E_VEC, f"rescale{t}",
                      self.cost.vector(m * self.dv * self.rescale_ops, read=m * self.dv * self.ab),
                      [("FX", "PV", t)], kind="rescale", step=t)

    def finish(self, t: int) -> None:
        """$O = O / \\ell$ (``rows x d_v_eff`` divisions) after the q-block's last $PV$."""
        i = self.steps[t][0]
        m = self.rows[i]
        fin_deps = [("RS", t)] if self.gm else [self.last_mm("PV", t)]
        self.prog.add(("FIN", i), self.E_VEC, f"final{i}", self.cost.vector(m * self.dv), fin_deps,
                      kind="final", step=t)

    # ---- buffer slots -----------------------------------------------------------------------
    def pools(self, l0_buffers: int, l0c: int) -> dict[str, int]:
        """Slots per buffer pool: one L1 Q buffer, ``n_buffers`` L1 B buffers ($K_j$ or $V_j$)
        and (Ascend) A buffers ($P$), ``l0_buffers`` L0A/L0B chunk pairs, ``l0c``
        accumulators."""
        pools = {"L1.Q": 1, "L1.B": self.n_buffers}
        if self.gm:
            pools["L1.A"] = self.n_buffers
        if self.E_MTE1:
            pools["L0"] = l0_buffers
        if self.gm:
            pools["L0C"] = l0c
        return pools
