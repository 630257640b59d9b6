"""The locality study's report page."""
