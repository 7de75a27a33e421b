"""smolagents' E2B executor (its remote Python executor for code agents) against the
code-interpreter template, with no model: code goes in, results and the final answer come out."""

import pytest

pytest.importorskip("smolagents")
pytest.importorskip("e2b_code_interpreter")
from smolagents.default_tools import FinalAnswerTool  # noqa: E402
from smolagents.monitoring import AgentLogger, LogLevel  # noqa: E402
from smolagents.remote_executors import E2BExecutor  # noqa: E402
from smolagents.utils import AgentError  # noqa: E402


@pytest.fixture
def executor(daemon):
    made = E2BExecutor([], AgentLogger(level=LogLevel.OFF), timeout=600)
    daemon.track(made.sandbox.sandbox_id)
    try:
        yield made
    finally:
        made.cleanup()


def test_smolagents_e2b_executor_runs_code_and_returns_the_final_answer(executor):
    executor.send_tools({"final_answer": FinalAnswerTool()})
    executor.send_variables({"numbers": [3, 4, 5]})
    step = executor("total = sum(numbers)\nprint('summed', total)\ntotal * 2")
    assert not step.is_final_answer
    assert step.output == "24"  # the main result's text, as with E2B's own server
    assert "summed 12" in step.logs
    # State carries over between steps, as for a code agent.
    final = executor("final_answer(f'the total is {total}')")
    assert final.is_final_answer
    assert final.output == "the total is 12"


def test_smolagents_e2b_executor_reports_an_error_with_its_traceback(executor):
    with pytest.raises(AgentError) as raised:
        executor("def broken():\n    return {}['missing']\nbroken()")
    message = str(raised.value)
    assert "KeyError" in message and "broken()" in message
