"""Bringing configuration in from files others maintain: LiteLLM's price file (prices),
eval cases from CSV, JSONL and promptfoo YAML (evals), an external quality index (quality).

Each import reads and checks the whole file first, then writes in one transaction: a file
that cannot be read raises ImportFileError naming the line, and nothing is changed. What is
read but not used (an assertion type with no grader here, a route with no price) is reported,
never dropped silently."""
