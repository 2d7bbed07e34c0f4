"""An episode as an MLflow trace: spans for the private rehearsals, ACT, REHEARSE, the real
tool calls and the guard's decisions, in the order they happened (logged after the
episode: episodes play in batches, so the spans carry order and content, not timing)."""

from __future__ import annotations

from envace.rehearsal.guard import is_high_risk
from envace.roles import act_text
from envace.rollout.runner import Episode


def log_trace(episode: Episode, rehearsals: list[Episode], model: str, flush: bool = True) -> str | None:
    """Log one trace into the active MLflow experiment (and run); returns its id. `flush`: wait
    until it is written (each flush waits ~0.5 s for MLflow's export queue to wake: a caller
    logging several traces passes False and flushes once after the last)."""
    import mlflow
    from mlflow.entities import SpanType

    task = episode.task
    with mlflow.start_span(f"episode {task.id}", span_type=SpanType.AGENT,
                           attributes={"model": model, "task_type": f"{task.domain}/{task.task_type}"}) as root:
        root.set_inputs({"task": task.id, "request": task.request, "private_rehearsals": len(rehearsals)})
        for k, imagined in enumerate(rehearsals, 1):
            with mlflow.start_span(f"private rehearsal {k}", span_type=SpanType.CHAIN) as span:
                span.set_inputs({"memory_episodes": len(imagined.memory or [])})
                _steps(imagined, real=False)
                span.set_outputs({"answer": imagined.answer, "failure": imagined.failure,
                                  "real_calls": imagined.real_calls})
        _steps(episode, real=True)
        root.set_outputs({"answer": episode.answer, "failure": episode.failure, "success": episode.success,
                          "real_calls": episode.real_calls,
                          "held": [v.call for v in episode.reviews if v.hold and not v.confirmed]})
    if flush:  # written before the caller (or the process) moves on
        mlflow.flush_trace_async_logging()
    return mlflow.get_last_active_trace_id()


def _steps(episode: Episode, real: bool) -> None:
    import mlflow
    from mlflow.entities import SpanType

    reviews, pending = iter(episode.reviews), []
    for turn, m in enumerate(episode.messages[1:]):
        if m["role"] == "act":
            with mlflow.start_span("ACT", span_type=SpanType.LLM) as span:
                span.set_inputs({"turn": turn, "memory": len(episode.memory or [])})
                span.set_outputs({"output": act_text(m)})
            pending = list(m.get("calls", []))
        elif m["role"] == "tool" and pending:
            call = pending.pop(0)
            if real and is_high_risk(episode.task, call["name"]):
                verdict = next(reviews, None)
                if verdict is not None:
                    with mlflow.start_span(f"GUARD {call['name']}", span_type=SpanType.GUARDRAIL) as span:
                        span.set_inputs({"call": call})
                        span.set_outputs({"hold": verdict.hold and not verdict.confirmed, "reason": verdict.reason,
                                          "rehearsed": verdict.rehearsed, "broken": verdict.broken,
                                          "confirmed": verdict.confirmed})
            if m.get("source") == "guard":
                continue  # held: never ran
            name, kind = (f"TOOL {call['name']}", SpanType.TOOL) if real else (f"REHEARSE {call['name']}", SpanType.LLM)
            with mlflow.start_span(name, span_type=kind) as span:
                span.set_inputs({"call": call})
                span.set_outputs({"response": m["response"], "source": m.get("source")})
        elif m["role"] == "failed_step":
            with mlflow.start_span("failed step", span_type=SpanType.UNKNOWN) as span:
                span.set_outputs({"reason": m["reason"]})
