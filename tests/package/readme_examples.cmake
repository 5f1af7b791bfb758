# Script-mode helpers of run_consumer.cmake.

# extract_readme_examples(readme output): writes every ```cpp block of `readme` into one C++ file.
# A block with an #include or a main() is a whole program: it goes in at namespace scope in its own
# namespace (its main renamed). Any other block is a fragment of a training program: it becomes the
# body of a function that has what fragments use (Net, x, y, loss_fn, optimizer, dataset_size) in
# scope. So every example compiles as the README shows it, or the package test fails naming it.
function(extract_readme_examples readme output)
  file(READ "${readme}" text)
  # CMake lists split at ';' and treat brackets specially: hide them while matching.
  string(REPLACE ";" "@SEMI@" text "${text}")
  string(REPLACE "[" "@LB@" text "${text}")
  string(REPLACE "]" "@RB@" text "${text}")
  string(REGEX MATCHALL "```cpp\n[^`]*```" blocks "${text}")
  list(LENGTH blocks count)
  if(count EQUAL 0)
    message(FATAL_ERROR "no ```cpp block found in ${readme}")
  endif()
  set(source "// Generated from ${readme} by tests/package/readme_examples.cmake.\n"
             "#include <ddp/ddp.h>\n#include <torch/torch.h>\n\n"
             "namespace readme_prelude {\n"
             "struct Net : torch::nn::Module {\n"
             "  Net() { fc = register_module(\"fc\", torch::nn::Linear(4, 1))@SEMI@ }\n"
             "  torch::Tensor forward(torch::Tensor x) { return fc(x)@SEMI@ }\n"
             "  torch::nn::Linear fc{nullptr}@SEMI@\n"
             "}@SEMI@\n"
             "inline torch::Tensor loss_fn(const torch::Tensor& a, const torch::Tensor& b) { return torch::mse_loss(a, b)@SEMI@ }\n"
             "}  // namespace readme_prelude\n\n")
  set(index 0)
  foreach(block IN LISTS blocks)
    math(EXPR index "${index} + 1")
    string(REGEX REPLACE "^```cpp\n" "" body "${block}")
    string(REGEX REPLACE "```$" "" body "${body}")
    if(body MATCHES "#include|main\\(")
      string(REGEX REPLACE "main\\(" "readme_main_${index}(" body "${body}")
      string(REGEX MATCHALL "#include[^\n]*\n" includes "${body}")
      string(REGEX REPLACE "#include[^\n]*\n" "" body "${body}")
      list(APPEND source ${includes} "namespace readme_example_${index} {\nusing namespace readme_prelude@SEMI@\n"
                         "${body}}  // namespace readme_example_${index}\n\n")
    else()
      list(APPEND source
        "// README example ${index}\n"
        "[[maybe_unused]] static void readme_example_${index}(torch::Tensor x, torch::Tensor y, "
        "torch::optim::Optimizer& optimizer, int64_t dataset_size) {\n"
        "  using namespace readme_prelude@SEMI@\n"
        "  (void)x@SEMI@ (void)y@SEMI@ (void)optimizer@SEMI@ (void)dataset_size@SEMI@\n"
        "${body}}\n\n")
    endif()
  endforeach()
  string(CONCAT source ${source})
  string(REPLACE "@SEMI@" ";" source "${source}")
  string(REPLACE "@LB@" "[" source "${source}")
  string(REPLACE "@RB@" "]" source "${source}")
  file(WRITE "${output}" "${source}")
  message(STATUS "extracted ${count} C++ examples from ${readme} into ${output}")
endfunction()

# check_port_diff(serial port work_dir): the port differs from the serial program (leading comment
# blocks aside) only in lines marked "// ddp:": 5 added lines and 3 changed ones, as in the README's
# "Port your program". `diff` gives the changed lines.
function(check_port_diff serial port work_dir)
  foreach(name serial port)
    file(READ "${${name}}" text)
    string(REGEX REPLACE "^(//[^\n]*\n)+" "" text "${text}")
    file(WRITE "${work_dir}/${name}.code" "${text}")
  endforeach()
  execute_process(COMMAND diff "${work_dir}/serial.code" "${work_dir}/port.code" OUTPUT_VARIABLE out
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 1)
    message(FATAL_ERROR "diff of ${serial} and ${port} failed or found no difference (exit ${rc})")
  endif()
  string(REPLACE ";" "@SEMI@" out "${out}")  # list separators, see extract_readme_examples
  string(REPLACE "[" "@LB@" out "${out}")
  string(REPLACE "]" "@RB@" out "${out}")
  string(REGEX MATCHALL "\n< [^\n]*" removed "\n${out}")
  string(REGEX MATCHALL "\n> [^\n]*" added "\n${out}")
  list(LENGTH removed removed_count)
  list(LENGTH added added_count)
  foreach(line IN LISTS added)
    if(NOT line MATCHES "// ddp: ")
      message(FATAL_ERROR "${port} changes a line not marked '// ddp:':${line}")
    endif()
  endforeach()
  if(NOT removed_count EQUAL 3 OR NOT added_count EQUAL 8)
    message(FATAL_ERROR "the port changes +${added_count} -${removed_count} lines; the README's "
                        "\"Port your program\" says +8 -3:\n${out}")
  endif()
  message(STATUS "port: +${added_count} -${removed_count} lines against the serial program")
endfunction()
