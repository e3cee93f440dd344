-- Registers a tenant on first use, with no limits.
INSERT INTO tenants (tenant) VALUES ($1) ON CONFLICT (tenant) DO NOTHING;
