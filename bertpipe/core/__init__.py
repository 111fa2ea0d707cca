"""The stage contract: what a stage is (declared), how one runs (stage), its code identity and output rules."""
