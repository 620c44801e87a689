"""tpfuse in vLLM: a general plugin, declared in pyproject.toml as the entry point
`tpfuse = "tpfuse.vllm_plugin:register"` of the group "vllm.general_plugins".

vLLM (vllm.plugins.load_general_plugins) calls every installed general plugin once in each process it
starts, the engine's and every worker's, before a worker builds its model, so before anything is
compiled; with VLLM_PLUGINS set, only the plugins it names (a comma-separated list). This module does
not import vLLM."""

import logging
from typing import Optional

from .symm_mem import SymmMemOverride, use_for_symm_mem

logger = logging.getLogger("tpfuse")

_override: Optional[SymmMemOverride] = None  # this process's, kept on for its lifetime


def register() -> None:
    """Makes tpfuse the CUDA kernel of torch's symm_mem fused ops in this process, which vLLM's async-TP
    pass (pass_config fuse_gemm_comms) calls; a second call changes nothing."""
    global _override
    if _override is None:
        _override = use_for_symm_mem()
        logger.info("tpfuse serves torch.ops.symm_mem's fused matmul + collective ops in this process "
                    "(vLLM plugin)")
