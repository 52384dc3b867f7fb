"""The command-line plumbing every command shares: options declared once and parsed
(options), running a command with one-line errors (command), TensorFlow's log muted
(tensorflow_logs), a child process's environment (child_process), whether a stream is a
terminal (terminal), a Markdown table (markdown)."""
