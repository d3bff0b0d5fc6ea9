"""What the runtime reports: OpenTelemetry traces, Prometheus metrics and transition logs."""
