"""The environment suite: native C envs (one folder each), their NumPy references,
and the contract checker `check_env`."""
from .check import EnvContractError, check_env

__all__ = ["check_env", "EnvContractError"]
