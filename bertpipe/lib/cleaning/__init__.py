"""Text cleaning, near-duplicate detection (MinHash) and the exclusion of evaluation texts from training text:
prepare cleans and deduplicates the domain corpus with them, tapt cleans its task corpus and excludes the task's
dev/test texts the same way, and the tasks stage finds near-duplicates across a task's splits with prepare's
MinHash settings."""
