fn main() {
    let k = tessera_dsl::library::get(&std::env::args().nth(1).unwrap()).unwrap();
    let code = tessera_codegen::x86::attention::emit(&k).unwrap();
    std::fs::write("/tmp/att.bin", &code.bytes).unwrap();
}
