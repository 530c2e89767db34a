//! libgranary (in progress)
