# The layers of lib/mmpost/ and the layers each may use directly (ARCHITECTURE.md):
#   apps -> train -> hub | dist -> model | data -> algo | io | config -> core
#   apps -> report -> io (metrics.jsonl and recipe.json of finished runs; no torch)
# A layer may use any layer to its right (the closure of these edges); layers on one tier ("|")
# never see each other. CMakeLists.txt links one static library per layer from this table and
# cmake/check_layers.cmake fails the build on an #include that is not an edge of its closure, so
# the target graph and the include rule cannot drift apart.
set(MMPOST_LAYERS core config io algo data model hub dist train report)
set(MMPOST_LAYER_USES_core "")
set(MMPOST_LAYER_USES_config core)
set(MMPOST_LAYER_USES_io core)
set(MMPOST_LAYER_USES_algo core)
set(MMPOST_LAYER_USES_data algo io config)
set(MMPOST_LAYER_USES_model algo io config)
set(MMPOST_LAYER_USES_hub model data)
set(MMPOST_LAYER_USES_dist model data)
set(MMPOST_LAYER_USES_train hub dist)
set(MMPOST_LAYER_USES_report io)

# Sets ${out} to every layer `layer` may include (its direct uses, transitively).
function(mmpost_layer_closure layer out)
  set(seen "")
  set(todo ${MMPOST_LAYER_USES_${layer}})
  while(todo)
    list(POP_FRONT todo l)
    if(NOT l IN_LIST seen)
      list(APPEND seen ${l})
      list(APPEND todo ${MMPOST_LAYER_USES_${l}})
    endif()
  endwhile()
  set(${out} ${seen} PARENT_SCOPE)
endfunction()
