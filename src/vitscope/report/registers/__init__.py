"""The registers study's report page and its figures."""
