"""The stage graph (which stages exist and feed which), its freshness plan, and the import contracts derived from
the folders."""
