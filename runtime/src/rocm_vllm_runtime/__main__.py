"""`python3 -m rocm_vllm_runtime`: the self-test CLI (rocm_vllm_runtime.selftest)."""
import sys

from rocm_vllm_runtime.selftest import main

sys.exit(main())
