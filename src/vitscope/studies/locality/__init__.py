"""The locality study (arXiv 2605.16390): the study runner, its results files and its verdicts."""
