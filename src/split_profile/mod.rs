//! split-profile: the tool-catalogue check (seed 000, criteria 1.2.0).
