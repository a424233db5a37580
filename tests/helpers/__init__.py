"""What several test files share: fixture builders, independent oracles, mutants, paths. Never a test."""
