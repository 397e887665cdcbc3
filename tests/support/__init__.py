"""What the tests share: the daemon harness, the tiny ONNX models, publishing into a watched
directory, load generators, the polling helper, the console's test data, and the stand-ins
(fakes/). Test files import from here, never from each other."""
