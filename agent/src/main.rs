fn main() -> std::process::ExitCode {
    ferry_agent::main_with(ferry_agent::builtin_registry())
}
