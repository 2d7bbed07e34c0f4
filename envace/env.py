"""Process environment for envace commands: nothing phones home, all state in the project.

Call `configure(root)` before importing Prefect, MLflow or DVC; values already set in the
environment win (so the Makefile, CI and users can override any of them).
"""

from __future__ import annotations

import os
from pathlib import Path


def defaults(root: Path) -> dict[str, str]:
    root = Path(root).resolve()
    return {
        "DO_NOT_TRACK": "1",
        "MLFLOW_DISABLE_TELEMETRY": "true",  # MLflow checks == "true"; DO_NOT_TRACK is not enough
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DVC_NO_ANALYTICS": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PREFECT_HOME": str(root / ".prefect"),
        "DVC_SITE_CACHE_DIR": str(root / ".dvc-site-cache"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        # stage lines reach the Prefect server (INFO) while the terminal shows warnings only
        "PREFECT_LOGGING_LEVEL": "INFO",
        "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
        "GIT_PYTHON_REFRESH": "quiet",
    }


def configure(root: Path) -> None:
    for key, value in defaults(root).items():
        os.environ.setdefault(key, value)
