"""Pictures of schedules: text grids, Chrome/Perfetto traces, matplotlib charts, HTML reports."""
