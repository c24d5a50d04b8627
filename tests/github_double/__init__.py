"""A stateful local GitHub (REST subset the bot uses) for tests: see state, server, gitrepo and fixture."""
