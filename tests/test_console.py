"""What a training prints: the console's lines and progress, and the whole log in the file."""

import io
import logging

import pytest
import tensorflow as tf

from cifar10_estimator.run import console


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class TerminalStream(io.StringIO):
    """A console that says it is a terminal."""

    def isatty(self):
        return True


@pytest.fixture
def run_console(tmp_path, monkeypatch):
    """Make a RunConsole on a StringIO (or a TerminalStream) with its log in tmp_path."""
    monkeypatch.setenv("TERM", "xterm")
    made = []

    def make(verbose=False, terminal=False):
        stream = TerminalStream() if terminal else io.StringIO()
        clock = FakeClock()
        made.append(console.RunConsole(str(tmp_path / "train.log"), verbose=verbose,
                                       stream=stream, clock=clock))
        made[-1].__enter__()
        return made[-1], stream, clock

    previous_level = tf.get_logger().level
    tf.get_logger().setLevel(logging.INFO)
    yield make
    for each in made:
        each.__exit__(None, None, None)
    tf.get_logger().setLevel(previous_level)


def log_file(tmp_path):
    return (tmp_path / "train.log").read_text()


def test_the_console_shows_its_lines_and_warnings_and_the_file_gets_everything(
        run_console, tmp_path):
    _, stream, _ = run_console()
    tf.compat.v1.logging.info("Average examples/sec: 512 (512), step = 10")
    console.console_logger().info("Recipe quick. Training to step 100")
    tf.compat.v1.logging.warning("the rate never drops")
    assert stream.getvalue().splitlines() == [
        "Recipe quick. Training to step 100", "warning: the rate never drops"]
    logged = log_file(tmp_path).splitlines()
    assert [line.split(" ", 2)[2] for line in logged] == [
        "INFO:tensorflow:Average examples/sec: 512 (512), step = 10",
        "INFO:tensorflow:Recipe quick. Training to step 100",
        "WARNING:tensorflow:the rate never drops"]


def test_verbose_prints_the_whole_log_as_tensorflow_did(run_console):
    _, stream, _ = run_console(verbose=True)
    tf.compat.v1.logging.info("Average examples/sec: 512 (512), step = 10")
    console.console_logger().info("Recipe quick.")
    assert stream.getvalue().splitlines() == [
        "INFO:tensorflow:Average examples/sec: 512 (512), step = 10",
        "INFO:tensorflow:Recipe quick."]


def test_the_log_file_is_appended_to_by_a_rerun(run_console, tmp_path):
    first, _, _ = run_console()
    tf.compat.v1.logging.info("first run")
    first.__exit__(None, None, None)
    run_console()
    tf.compat.v1.logging.info("second run")
    assert [line.split(":")[-1] for line in log_file(tmp_path).splitlines()] == [
        "first run", "second run"]


def test_tensorflow_logs_to_its_own_handlers_again_after_the_run(run_console, tmp_path):
    handlers_before = list(tf.get_logger().handlers)
    made, stream, _ = run_console()
    made.__exit__(None, None, None)
    tf.compat.v1.logging.info("after the run")
    assert "after the run" not in stream.getvalue() + log_file(tmp_path)
    assert tf.get_logger().handlers == handlers_before


def test_start_up_notices_go_to_the_file_only(run_console, tmp_path):
    made, stream, _ = run_console()
    made.startup_output(
        "2026-11-26 17:29:58.385943: E external/local_xla/xla/stream_executor/cuda/"
        "cuda_dnn.cc:9261] Unable to register cuDNN factory: Attempting to register\n"
        "2026-11-26 17:30:00.308527: W tensorflow/compiler/tf2tensorrt/utils/py_utils.cc:38] "
        "TF-TRT Warning: Could not find TensorRT\n"
        "2026-11-26 17:30:00.4: W something else went wrong\n")
    assert stream.getvalue().splitlines() == ["2026-11-26 17:30:00.4: W something else went wrong"]
    assert "Unable to register cuDNN factory" in log_file(tmp_path)
    assert "Could not find TensorRT" in log_file(tmp_path)


def test_off_a_terminal_progress_comes_every_5_percent_or_every_minute(run_console, tmp_path):
    made, stream, clock = run_console()
    shown = []
    for step, secs in [(1, 0), (3, 10), (5, 20), (6, 30), (7, 95), (8, 100), (10, 110),
                       (100, 200), (100, 230)]:
        clock.now = secs
        made.show_progress("step %d/100" % step, step / 100)
    shown = stream.getvalue().splitlines()
    # The first; 5 %; 7 %, a minute after the one before; 10 %; and the end, once.
    assert shown == ["step 1/100", "step 5/100", "step 7/100", "step 10/100", "step 100/100"]
    assert [line.split(":")[-1] for line in log_file(tmp_path).splitlines()] == shown


def test_on_a_terminal_progress_is_one_line_redrawn_in_place(run_console):
    made, stream, clock = run_console(terminal=True)
    made.show_progress("step 10/100", 0.1)
    clock.now = 1
    made.show_progress("step 20/100", 0.2)
    console.console_logger().info("evaluation of step 20")
    clock.now = 1.1  # too soon for a redraw
    made.show_progress("step 21/100", 0.21)
    clock.now = 2
    made.show_progress("step 100/100", 1.0)
    console.console_logger().info("Test accuracy")
    made.show_progress("step 100/100", 1.0)
    text = stream.getvalue()
    lines = text.split("\n")
    # One terminal line redrawn: "\r" and a clear, then the bar and the line. A line
    # written meanwhile takes its place, and the progress line is drawn again under it.
    assert lines[0] == ("[==                  ] step 10/100\r\x1b[K"
                        "[====                ] step 20/100\r\x1b[K"
                        "evaluation of step 20")
    assert lines[1] == ("[====                ] step 20/100\r\x1b[K"
                        "[====================] step 100/100")
    # At the end the progress line stays, and what follows goes under it.
    assert lines[2:] == ["Test accuracy", ""]
    assert "step 21/100" not in text


def test_log_file_names_one_file_per_task_of_a_cluster():
    from cifar10_estimator.distributed import cluster
    chief = cluster.task_from_tf_config(
        '{"cluster": {"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]}, '
        '"task": {"type": "chief", "index": 0}}')
    worker = cluster.task_from_tf_config(
        '{"cluster": {"chief": ["a:1"], "worker": ["b:1"], "ps": ["c:1"]}, '
        '"task": {"type": "worker", "index": 0}}')
    assert console.log_file_name(None) == console.log_file_name(chief) == "train.log"
    assert console.log_file_name(worker) == "train.worker-0.log"
