package sg

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -mcpu=v3 -Wall -Werror -I../../bpf/include" -target bpfel -type sg_group -type sg_worker -type sg_result -type sg_slot -type sg_stats -type kedge_mark sg ../../bpf/sg/sg.bpf.c

// The example user reduction (bpf/include/sg_user.h), built with the project's flags as a
// user builds one (docs/sg.md, "User reductions"); its DWARF stripped as bpf2go strips it.
//go:generate clang-19 -target bpf -O2 -g -mcpu=v3 -Wall -Werror -I../../bpf/include -c ../../bpf/sg/user/topk.bpf.c -o testdata/topk_bpfel.o
//go:generate llvm-strip-19 --strip-debug testdata/topk_bpfel.o
//go:generate clang-19 -target bpf -O2 -g -mcpu=v3 -Wall -Werror -I../../bpf/include -c testdata/user_bad.bpf.c -o testdata/user_bad_bpfel.o
//go:generate llvm-strip-19 --strip-debug testdata/user_bad_bpfel.o
