"""The stage families, side by side: each folder is one family's declaration, params and build; none imports another."""
