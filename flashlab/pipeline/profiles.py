"""The hardware profiles, each number sourced: NVIDIA A100/H100 (chip and one SM), Ascend 910B
(chip and one AI Core, with its pipeline :class:`~flashlab.pipeline.params.CoreModel`).

:data:`ASCEND_910B_CORES` is the one source of the 910B's AI Core count.
"""
from __future__ import annotations

from flashlab.pipeline.params import (
    ComputeUnit,
    CoreModel,
    DataPath,
    Engine,
    GiB,
    HardwareProfile,
    KiB,
    MemoryLevel,
    MiB,
    Param,
)

__all__ = ["CITATIONS", "citation", "FA1", "A100_WP", "A100_DS", "H100_WP", "H100_DS", "SEED_002",
           "CATLASS", "INI_910B2", "ASCENDC_ARCH", "A100_40GB", "A100_80GB", "H100", "MEMORY_RATES",
           "ASCEND_910B_CORE_MODEL", "ASCEND_910B", "ASCEND_910B_AI_CORE", "PTX_ISA", "CUDA_GUIDE",
           "FA3", "A100_SM", "H100_SM", "PROFILES", "ASCEND_910B_CORES"]


# --------------------------------------------------------------------------------------------
# Sources
# --------------------------------------------------------------------------------------------
FA1 = "Dao et al., FlashAttention (NeurIPS 2022), Sec. 2.1 and Fig. 1"
A100_WP = "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020)"
A100_DS = "NVIDIA A100 datasheet (80GB SXM)"
H100_WP = "NVIDIA H100 Tensor Core GPU Architecture whitepaper (2022)"
H100_DS = "NVIDIA H100 datasheet (SXM5)"
SEED_002 = "article 'Ascend上的FlashAttention实现', Sec. 2.1 (an A100 80G SXM)"
CATLASS = "Huawei catlass include/catlass/arch/arch.hpp, struct AtlasA2"
INI_910B2 = "CANN platform_config/Ascend910B2.ini"
ASCENDC_ARCH = ("CANN Ascend C documentation, AI Core architecture of Atlas A2 "
                "(split AIC/AIV; data paths and their engines)")


#: the bibliography key (book/references.bib) of each Ascend source above
CITATIONS = {INI_910B2: "cann_platform_config", CATLASS: "catlass_arch", ASCENDC_ARCH: "ascendc_arch_doc"}


def citation(param: Param) -> str | None:
    """The bibliography key of the first source of :data:`CITATIONS` that ``param`` names, or None."""
    return next((key for src, key in CITATIONS.items() if src in param.source), None)


def _count(n: int, source: str) -> Param:
    return Param(n, "instances", source)


# --------------------------------------------------------------------------------------------
# NVIDIA A100 SXM4
# --------------------------------------------------------------------------------------------
_A100_SMS = _count(108, f"{A100_WP}; {FA1}")
_A100_HBM_BW_40 = Param(1555e9, "B/s", f"{A100_WP} (40GB HBM2); {FA1} gives the range 1.5-2.0 TB/s")
_A100_HBM_BW_80 = Param(2039e9, "B/s", f"{A100_DS} (HBM2e); also {SEED_002}: 2039 GB/s")
_A100_PEAK = Param(312e12, "FLOP/s", f"{A100_WP} (dense fp16/bf16 tensor core); {FA1}; {SEED_002}")
_A100_SRAM_BW = Param(19e12, "B/s", f"{FA1}: 'estimated around 19TB/s'")


def _a100(name: str, hbm_gb: int, hbm_bw: Param) -> HardwareProfile:
    return HardwareProfile(
        name=name,
        scope="chip",
        peak_flops=_A100_PEAK,
        hbm_bandwidth=hbm_bw,
        memories=(
            MemoryLevel("registers", Param(256 * KiB, "B", f"{A100_WP}: 64K 32-bit registers per SM"),
                        _A100_SMS),
            MemoryLevel("SRAM (shared memory/L1)",
                        Param(192 * KiB, "B", f"{A100_WP}: 192 KB combined L1/shared memory per SM; "
                                              f"{FA1}"),
                        _A100_SMS, _A100_SRAM_BW,
                        note="what the FlashAttention paper calls SRAM: on-chip, per SM"),
            MemoryLevel("L2", Param(40e6, "B", f"{A100_WP}: 40 MB; {SEED_002}"),
                        _count(1, "one L2 per chip")),
            MemoryLevel("HBM", Param(hbm_gb * 1e9, "B", f"{A100_WP} / {A100_DS}; {FA1}: 40-80GB"),
                        _count(1, "one HBM pool per chip"), hbm_bw),
            MemoryLevel("CPU DRAM", Param(1e12, "B", f"{FA1}: '>1 TB' (host memory; varies by host)"),
                        _count(1, "the host"), Param(12.8e9, "B/s", f"{FA1}: 12.8 GB/s"),
                        note="host memory, reached over PCIe"),
        ),
        compute=(ComputeUnit("tensor core",
                             Param(_A100_PEAK.value, "FLOP/s", f"{A100_WP} (dense fp16)")),),
        paths=(
            DataPath("HBM", "L2", "memory controller", A100_WP),
            DataPath("L2", "SRAM (shared memory/L1)", "cp.async / load", A100_WP),
            DataPath("SRAM (shared memory/L1)", "registers", "ld.shared / ldmatrix", A100_WP),
            DataPath("registers", "tensor core", "mma", A100_WP),
        ),
        notes=f"{_A100_SMS.value:g} SMs; the FlashAttention paper's SRAM is the per-SM shared memory, "
              "not the L2",
    )


A100_40GB = _a100("NVIDIA A100 SXM4 40GB", 40, _A100_HBM_BW_40)
#: the A100 that the article "Ascend上的FlashAttention实现" quotes (80 GB, 2039 GB/s)
A100_80GB = _a100("NVIDIA A100 SXM4 80GB", 80, _A100_HBM_BW_80)

# --------------------------------------------------------------------------------------------
# NVIDIA H100 SXM5
# --------------------------------------------------------------------------------------------
_H100_SMS = _count(132, f"{H100_WP} (H100 SXM5)")
_H100_HBM_BW = Param(3.35e12, "B/s", f"{H100_DS}: HBM3 3.35 TB/s")
_H100_PEAK = Param(989.4e12, "FLOP/s", f"{H100_DS}: 1979 TFLOPS fp16 with sparsity, half of it dense")

H100 = HardwareProfile(
    name="NVIDIA H100 SXM5 80GB",
    scope="chip",
    peak_flops=_H100_PEAK,
    hbm_bandwidth=_H100_HBM_BW,
    memories=(
        MemoryLevel("registers", Param(256 * KiB, "B", f"{H100_WP}: 64K 32-bit registers per SM"),
                    _H100_SMS),
        MemoryLevel("SRAM (shared memory/L1)",
                    Param(228 * KiB, "B", f"{H100_WP}: shared memory up to 228 KB per SM "
                                          "(256 KB combined L1/shared)"),
                    _H100_SMS, None),
        MemoryLevel("L2", Param(50e6, "B", f"{H100_WP}: 50 MB"), _count(1, "one L2 per chip")),
        MemoryLevel("HBM", Param(80e9, "B", f"{H100_DS}: 80 GB HBM3"),
                    _count(1, "one HBM pool per chip"), _H100_HBM_BW),
    ),
    compute=(ComputeUnit("tensor core", Param(_H100_PEAK.value, "FLOP/s", f"{H100_DS} (dense fp16)")),),
    paths=(
        DataPath("HBM", "L2", "memory controller", H100_WP),
        DataPath("L2", "SRAM (shared memory/L1)", "TMA (Tensor Memory Accelerator)", H100_WP),
        DataPath("SRAM (shared memory/L1)", "tensor core", "wgmma (operands from shared memory)", H100_WP),
    ),
    notes="TMA copies whole tiles HBM -> shared memory asynchronously, like Ascend's MTE2",
)

# --------------------------------------------------------------------------------------------
# Huawei Ascend 910B (Atlas A2): one AI Core and the chip
# --------------------------------------------------------------------------------------------
_CUBE_FREQ = Param(1.8e9, "Hz", f"{INI_910B2} [AICoreSpec] cube_freq=1800 (MHz)")
_CUBE_MACS = Param(16 * 16 * 16, "MAC/cycle", f"{INI_910B2} [AICoreSpec] cube_m/n/k_size=16 (fp16)")
_N_AIC = _count(24, f"{INI_910B2} [SoCInfo] cube_core_cnt=24")
_N_AIV = _count(48, f"{INI_910B2} [SoCInfo] vector_core_cnt=48 (2 per cube core)")
# pi_core = 16^3 MAC/cycle * 2 FLOP/MAC * 1.8 GHz
_AIC_PEAK = Param(_CUBE_MACS.value * 2 * _CUBE_FREQ.value, "FLOP/s",
                  "16*16*16 MAC/cycle x 2 FLOP/MAC x 1.8 GHz (not published by Huawei)", "derived")
# pi_chip = 24 AI Cores * pi_core
_CHIP_PEAK = Param(_N_AIC.value * _AIC_PEAK.value, "FLOP/s",
                   "24 AI Cores x 16^3 x 2 x 1.8 GHz ~ 354 TFLOPS fp16 (not published by Huawei)", "derived")
_HBM_BW = Param(1.6e12, "B/s",
                "no official figure found; community figures for 910B disagree (roughly 1.2-1.8 TB/s; "
                "msmodeling's device.py: 1.6 TiB/s; ini ddr_rate=32 B/cycle x 24 x 1.85 GHz = 1.42 TB/s "
                "if read per core). A model parameter: move it with with_hbm_bandwidth()", "assumption",
                1.2e12, 1.8e12)   # the range; _HBM_BW_CORE below divides it by the core count
# the share of one AI Core when all 24 stream at once
_HBM_BW_CORE = Param(_HBM_BW.value / _N_AIC.value, "B/s",
                     "the assumed chip HBM bandwidth / 24 AI Cores", "assumption",
                     1.2e12 / _N_AIC.value, 1.8e12 / _N_AIC.value)

_L1 = Param(512 * KiB, "B", f"{CATLASS} L1_SIZE; {INI_910B2} l1_size=524288")
_L0A = Param(64 * KiB, "B", f"{CATLASS} L0A_SIZE; {INI_910B2} l0_a_size=65536")
_L0B = Param(64 * KiB, "B", f"{CATLASS} L0B_SIZE; {INI_910B2} l0_b_size=65536")
_L0C = Param(128 * KiB, "B", f"{CATLASS} L0C_SIZE; {INI_910B2} l0_c_size=131072")
_UB = Param(192 * KiB, "B", f"{CATLASS} UB_SIZE; {INI_910B2} ub_size=196608 (per vector core)")
_L2 = Param(192 * MiB, "B", f"{INI_910B2} [SoCInfo] l2_size=201326592 (192 MiB)")
_GM = Param(64 * GiB, "B", f"{INI_910B2} [SoCInfo] memory_size=68719476736 (64 GiB HBM)")

_ASCEND_PATHS = (
    DataPath("GM", "L1", "MTE2", ASCENDC_ARCH),
    DataPath("L1", "L0A", "MTE1", ASCENDC_ARCH),
    DataPath("L1", "L0B", "MTE1", ASCENDC_ARCH),
    DataPath("L0A", "Cube", "Cube reads", ASCENDC_ARCH),
    DataPath("L0B", "Cube", "Cube reads", ASCENDC_ARCH),
    DataPath("Cube", "L0C", "Cube writes", ASCENDC_ARCH),
    DataPath("L0C", "GM", "FixPipe", ASCENDC_ARCH),
    DataPath("GM", "UB", "MTE2", ASCENDC_ARCH),
    DataPath("UB", "Vector", "Vector reads/writes", ASCENDC_ARCH),
    DataPath("UB", "GM", "MTE3", ASCENDC_ARCH),
)


def _ascend(name: str, scope: str, n_aic: Param, n_aiv: Param, peak: Param, bw: Param,
            core: CoreModel | None = None) -> HardwareProfile:
    return HardwareProfile(
        name=name,
        scope=scope,
        peak_flops=peak,
        hbm_bandwidth=bw,
        memories=(
            MemoryLevel("L0A", _L0A, n_aic, note="left matrix operand of the Cube"),
            MemoryLevel("L0B", _L0B, n_aic, note="right matrix operand of the Cube"),
            MemoryLevel("L0C", _L0C, n_aic, note="Cube accumulator (fp32)"),
            MemoryLevel("L1", _L1, n_aic, note="cube core staging buffer"),
            MemoryLevel("UB", _UB, n_aiv, note="Unified Buffer of each vector core"),
            MemoryLevel("L2", _L2, _count(1, f"one L2 per chip: {ASCENDC_ARCH}"),
                        note="shared by all cores; not per core"),
            MemoryLevel("GM", _GM, _count(1, f"one HBM pool per chip: {ASCENDC_ARCH}"), _HBM_BW,
                        note="Global Memory = HBM; not per core"),
        ),
        compute=(
            ComputeUnit("Cube", peak, "16x16x16 fp16 matrix unit of each AI Core (AIC)"),
            ComputeUnit("Vector", None,
                        "SIMD unit of each vector core (AIV); its rate is the core model's vector engine"),
        ),
        paths=_ASCEND_PATHS,
        notes="split architecture: AIC (cube core: MTE1, MTE2, Cube, FixPipe; L1, L0A/B/C) and "
              "2 AIV per AIC (vector core: MTE2, MTE3, Vector; UB); AIC and AIV exchange data "
              "through GM/L2",
        core=core,
    )


# --- the engines of one AI Core, for the pipeline model -------------------------------------
MEMORY_RATES = ("CANN platform configs [AICoreMemoryRates] (byte/cycle per core) as quoted in "
                "CANN ops unit tests and third-party tooling tests")


def _cycles(n: int, clock: Param, why: str, lo: int | None = None, hi: int | None = None) -> Param:
    """A start latency of ``n`` cycles of ``clock``, in seconds (always an assumption; the range
    considered, when given, is ``lo`` .. ``hi`` cycles)."""
    # t = n / f
    if lo is None or hi is None:
        return Param(n / clock.value, "s", f"assumed {n} cycles at {clock.value / 1e9:g} GHz: {why}",
                     "assumption")
    return Param(n / clock.value, "s", f"assumed {n} cycles ({lo}-{hi} considered) at "
                 f"{clock.value / 1e9:g} GHz: {why}", "assumption", lo / clock.value, hi / clock.value)


_LAT_DMA = "issue, address set-up and the first GM round trip; no figure found"
_LAT_ON_CHIP = "issue and the set/wait flags that order it; no figure found"
# share of the HBM bandwidth of one AI Core: beta_core = beta_chip / 24, the core profile's
# hbm_bandwidth; MTE2 and MTE3 (HBM_ENGINES) stream at it, and with_hbm_bandwidth keeps them so
_MTE2_RATE = Param(_HBM_BW_CORE.value, "B/s",
                   "hbm_bandwidth (1.6 TB/s, itself an assumption) / 24 AI Cores: one core's share "
                   "when all 24 stream at once", "derived", _HBM_BW_CORE.low, _HBM_BW_CORE.high)
# the GM workspace (S, P, partial O) stays in the 192 MiB L2: 110 byte/cycle x 1.8 GHz
_WORKSPACE_BW = Param(110 * _CUBE_FREQ.value, "B/s",
                      f"l2_rate=110 byte/cycle ({MEMORY_RATES}, for an Ascend910B1.ini; not "
                      "checked against a CANN package) x 1.8 GHz; 86 (l2_write_rate) to 256 "
                      "(pypto's default) byte/cycle considered", "assumption",
                      86 * _CUBE_FREQ.value, 256 * _CUBE_FREQ.value)

ASCEND_910B_CORE_MODEL = CoreModel(
    exchange="gm",
    load=Engine("MTE2", _MTE2_RATE, _cycles(200, _CUBE_FREQ, _LAT_DMA, 100, 1000), "GM -> L1 on the cube core"),
    l1_to_l0=Engine(
        "MTE1",
        # 256 byte/cycle x 1.8 GHz
        Param(256 * _CUBE_FREQ.value, "B/s",
              f"256 byte/cycle x 1.8 GHz: {MEMORY_RATES} give l1_to_l0_a_rate=512 and "
              "l1_to_l0_b_rate=256 for earlier Ascend chips; no 910B value found; the slower "
              "one is used for both operands", "assumption", 128 * _CUBE_FREQ.value, 512 * _CUBE_FREQ.value),
        _cycles(20, _CUBE_FREQ, _LAT_ON_CHIP, 10, 100), "L1 -> L0A/L0B"),
    matmul=Engine(
        "CUBE",
        # 16*16*16 MAC/cycle x 1.8 GHz
        Param(_CUBE_MACS.value * _CUBE_FREQ.value, "MAC/s",
              f"16*16*16 MAC/cycle x 1.8 GHz ({INI_910B2} cube_m/n/k_size, cube_freq)", "derived"),
        _cycles(20, _CUBE_FREQ, "filling the Cube's pipeline; no figure found", 10, 100),
        "one 16x16x16 fractal per cycle"),
    mma_m=Param(16, "elements", f"{INI_910B2} [AICoreSpec] cube_m_size=16"),
    mma_n=Param(16, "elements", f"{INI_910B2} [AICoreSpec] cube_n_size=16"),
    mma_k=Param(16, "elements", f"{INI_910B2} [AICoreSpec] cube_k_size=16 (fp16)"),
    acc_out=Engine("FIXPIPE", _WORKSPACE_BW, _cycles(50, _CUBE_FREQ, _LAT_ON_CHIP, 10, 100),
                   "L0C -> GM workspace; assumed limited by the workspace (L2) rate"),
    vector=Engine(
        "VECTOR",
        # 2 AIV x 64 fp32 lanes x 1.8 GHz
        Param(2 * 64 * _CUBE_FREQ.value, "element/s",
              "2 AIV x 64 fp32 operations/cycle x 1.8 GHz: one 256-byte vector repeat per cycle "
              "(ini [AICoreSpec] vec_calc_size=128 fp16 lanes); vector clock assumed equal to the "
              "cube clock; half that issue rate to the full one considered", "assumption",
              64 * _CUBE_FREQ.value, 2 * 64 * _CUBE_FREQ.value),
        _cycles(50, _CUBE_FREQ, _LAT_ON_CHIP, 10, 100),
        "both vector cores together; each takes half of the rows"),
    exp_rate=Param(2 * 64 * _CUBE_FREQ.value, "exp/s",
                   "assumed to issue at the full vector rate; no figure found (pypto's fitted cost "
                   "model: TEXP about 32 elements/cycle per AIV, half of it: the low end considered)",
                   "assumption", 2 * 32 * _CUBE_FREQ.value, 2 * 64 * _CUBE_FREQ.value),
    store=Engine("MTE3", _MTE2_RATE, _cycles(200, _CUBE_FREQ, _LAT_DMA, 100, 1000), "UB -> GM on the vector cores"),
    vector_units=_count(2, f"2 vector cores (AIV) per AI Core: {ASCENDC_ARCH}"),
    buffers=(("L1", "L1"), ("L0A", "L0A"), ("L0B", "L0B"), ("L0C", "L0C"), ("UB", "UB")),
    workspace_bandwidth=_WORKSPACE_BW,
    note="AIC engines MTE2, MTE1, CUBE, FIXPIPE; AIV engines VECTOR, MTE3 (the vector cores' own "
         "GM -> UB reads are counted in the VECTOR tasks)",
)


ASCEND_910B = _ascend("Huawei Ascend 910B (A2)", "chip", _N_AIC, _N_AIV, _CHIP_PEAK, _HBM_BW)
ASCEND_910B_AI_CORE = _ascend("Ascend 910B AI Core", "core",
                              _count(1, f"one cube core (AIC) per AI Core: {ASCENDC_ARCH}"),
                              _count(2, f"2 vector cores (AIV) per AI Core: {ASCENDC_ARCH}"),
                              _AIC_PEAK, _HBM_BW_CORE, ASCEND_910B_CORE_MODEL)

# --------------------------------------------------------------------------------------------
# One SM of an A100 / H100, for comparison with one AI Core
# --------------------------------------------------------------------------------------------
PTX_ISA = "NVIDIA PTX ISA (warp-level / warpgroup-level matrix instructions)"
CUDA_GUIDE = ("CUDA C++ Programming Guide, throughput of native arithmetic instructions "
              "(16 results per clock per SM for exp2f on compute capability 8.x/9.0)")
FA3 = "Shah et al., FlashAttention-3 (2024), Sec. 3"
_A100_CLOCK = Param(1.41e9, "Hz", f"{A100_WP}: boost clock 1410 MHz")
_H100_CLOCK = Param(1.83e9, "Hz", "assumed ~1.83 GHz (H100 SXM5 boost clocks quoted between 1.755 "
                                  "and 1.98 GHz); only used for start latencies", "assumption")


def _per_sm(total: Param, sms: Param, unit: str, what: str, per: float = 1.0) -> Param:
    # x_SM = x_chip / (SMs * per)
    return Param(total.value / (sms.value * per), unit, f"{what} / {sms.value:g} SMs", "derived")


def _sm(name: str, chip: HardwareProfile, sms: Param, smem: Param, clock: Param,
        core: dict) -> HardwareProfile:
    hbm_share = _per_sm(chip.hbm_bandwidth, sms, "B/s", f"{chip.name} HBM bandwidth")
    return HardwareProfile(
        name=name,
        scope="core",
        peak_flops=_per_sm(chip.peak_flops, sms, "FLOP/s", f"{chip.name} dense fp16 peak"),
        hbm_bandwidth=hbm_share,
        memories=(
            MemoryLevel("registers", chip.memory("registers").capacity, _count(1, "one SM")),
            MemoryLevel("shared memory", smem, _count(1, "one SM")),
            MemoryLevel("HBM", chip.memory("HBM").capacity, _count(1, "one HBM pool per chip"),
                        chip.hbm_bandwidth, note="shared by all SMs; not per SM"),
        ),
        compute=(ComputeUnit("tensor core", _per_sm(chip.peak_flops, sms, "FLOP/s",
                                                     f"{chip.name} dense fp16 peak")),),
        paths=chip.paths,
        notes=f"one of the {sms.value:g} SMs of the {chip.name}",
        core=CoreModel(
            exchange="registers",
            load=Engine(core["load"], hbm_share, _cycles(200, clock, _LAT_DMA), "HBM -> shared memory"),
            store=Engine(core["store"], hbm_share, _cycles(200, clock, _LAT_DMA), "registers -> HBM"),
            vector_units=_count(1, "the SM's FP32 cores work on the tile in registers"),
            buffers=(("L1", "shared memory"), ("L0A", "registers"), ("L0B", "registers"),
                     ("L0C", "registers"), ("UB", "registers")),
            **{k: v for k, v in core.items() if k not in ("load", "store")},
        ),
    )


A100_SM = _sm(
    "NVIDIA A100 SXM4 80GB, one SM", A100_80GB, _A100_SMS,
    Param(164 * KiB, "B", f"{A100_WP}: shared memory configurable up to 164 KB per SM"),
    _A100_CLOCK,
    dict(load="cp.async", store="st.global",
         l1_to_l0=Engine("ldmatrix", _per_sm(_A100_SRAM_BW, _A100_SMS, "B/s",
                                             f"{FA1}: shared memory "
                                             f"~{_A100_SRAM_BW.value / 1e12:g} TB/s"),
                         _cycles(20, _A100_CLOCK, _LAT_ON_CHIP), "shared memory -> registers"),
         matmul=Engine("TENSOR", _per_sm(A100_80GB.peak_flops, _A100_SMS, "MAC/s",
                                         f"{A100_80GB.peak_flops.value / 1e12:g} TFLOPS dense fp16 "
                                         "/ 2 FLOP per MAC", per=2.0),
                       _cycles(20, _A100_CLOCK, "filling the tensor core pipeline")),
         mma_m=Param(16, "elements", f"{PTX_ISA}: mma.sync m16n8k16 (fp16)"),
         mma_n=Param(8, "elements", f"{PTX_ISA}: mma.sync m16n8k16 (fp16)"),
         mma_k=Param(16, "elements", f"{PTX_ISA}: mma.sync m16n8k16 (fp16)"),
         vector=Engine("FP32", _per_sm(Param(19.5e12, "FLOP/s", A100_DS), _A100_SMS, "element/s",
                                       f"{A100_DS}: FP32 19.5 TFLOPS / 2 FLOP per FMA", per=2.0),
                       _cycles(20, _A100_CLOCK, _LAT_ON_CHIP), "the SM's 64 FP32 lanes"),
         exp_rate=Param(16 * _A100_CLOCK.value, "exp/s",
                        f"{CUDA_GUIDE} x {_A100_CLOCK.value / 1e6:g} MHz", "derived")),
)

H100_SM = _sm(
    "NVIDIA H100 SXM5 80GB, one SM", H100, _H100_SMS,
    Param(228 * KiB, "B", f"{H100_WP}: shared memory up to 228 KB per SM"),
    _H100_CLOCK,
    dict(load="TMA", store="TMA store",
         matmul=Engine("TENSOR", _per_sm(H100.peak_flops, _H100_SMS, "MAC/s",
                                         f"{H100.peak_flops.value / 1e12:g} TFLOPS dense fp16 "
                                         "/ 2 FLOP per MAC", per=2.0),
                       _cycles(20, _H100_CLOCK, "filling the tensor core pipeline"),
                       "wgmma reads its operands from shared memory: no separate L1 -> L0 mover"),
         mma_m=Param(64, "elements", f"{PTX_ISA}: wgmma.mma_async m64nNk16 (fp16)"),
         mma_n=Param(8, "elements", f"{PTX_ISA}: wgmma.mma_async m64nNk16, N a multiple of 8"),
         mma_k=Param(16, "elements", f"{PTX_ISA}: wgmma.mma_async m64nNk16 (fp16)"),
         vector=Engine("FP32", _per_sm(Param(67e12, "FLOP/s", H100_DS), _H100_SMS, "element/s",
                                       f"{H100_DS}: FP32 67 TFLOPS / 2 FLOP per FMA", per=2.0),
                       _cycles(20, _H100_CLOCK, _LAT_ON_CHIP), "the SM's 128 FP32 lanes"),
         exp_rate=_per_sm(Param(3.9e12, "exp/s", FA3), _H100_SMS, "exp/s",
                          f"{FA3}: 3.9 TFLOPS of special functions on H100 SXM5")),
)

#: every profile defined here, by a short key
PROFILES: dict[str, HardwareProfile] = {
    "a100-40gb": A100_40GB,
    "a100-80gb": A100_80GB,
    "h100": H100,
    "ascend-910b": ASCEND_910B,
    "ascend-910b-core": ASCEND_910B_AI_CORE,
    "a100-sm": A100_SM,
    "h100-sm": H100_SM,
}

#: the number of AI Cores (cube cores) of an Ascend 910B, the chip's peak over one core's
ASCEND_910B_CORES = int(_N_AIC.value)
