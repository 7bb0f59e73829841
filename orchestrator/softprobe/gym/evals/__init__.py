"""Evaluation batches: suites, the runner, grading with Promptfoo, and the HTML report."""
