"""envace — train tool-using agents whose environment is rehearsed by the agent itself.

The library is importable without the orchestration stack (Prefect, MLflow, DVC):
`flows/` and `envace.tracking` are the only places that import those.
"""

__version__ = "0.1.0"
