//! Locality-aware assignment of a global step's samples to nodes and ranks.
