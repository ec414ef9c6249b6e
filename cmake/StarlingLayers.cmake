# The libraries in layers, lowest first. A library may link only libraries of lower layers, so the
# dependency direction README.md draws holds by construction: configuring fails, naming both, when
# a library links one of its own layer or above, and when a starling_* library is in no layer.
set(STARLING_LAYERS
    "starling_common starling_openblas starling_proto"
    "starling_kernels_cuda"
    "starling_kernels_nccl"
    "starling_kernels"
    "starling_model starling_data"
    "starling_optimizer"
    "starling_peer starling_daemon"
    "starling_experiment"
    "starling_swarm"
    "starling_service starling_cli")

# Checks the libraries defined in the given source directories.
function(starling_check_layers)
    set(index 0)
    foreach(layer IN LISTS STARLING_LAYERS)
        separate_arguments(members UNIX_COMMAND "${layer}")
        foreach(member IN LISTS members)
            set(layer_of_${member} ${index})
        endforeach()
        math(EXPR index "${index} + 1")
    endforeach()
    foreach(directory IN LISTS ARGN)
        get_property(targets DIRECTORY ${directory} PROPERTY BUILDSYSTEM_TARGETS)
        foreach(target IN LISTS targets)
            get_target_property(type ${target} TYPE)
            if(NOT target MATCHES "^starling_" OR NOT type MATCHES "LIBRARY$")
                continue()
            endif()
            if(NOT DEFINED layer_of_${target})
                message(FATAL_ERROR "library ${target} is in no layer: add it to STARLING_LAYERS "
                                    "(cmake/StarlingLayers.cmake) where its dependencies put it")
            endif()
            set(links)
            foreach(property LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
                get_target_property(found ${target} ${property})
                if(found)
                    list(APPEND links ${found})
                endif()
            endforeach()
            foreach(link IN LISTS links)
                if(DEFINED layer_of_${link} AND NOT layer_of_${link} LESS layer_of_${target})
                    message(FATAL_ERROR "${target} links ${link}, which is not below it "
                                        "(cmake/StarlingLayers.cmake, README.md's layout)")
                endif()
            endforeach()
        endforeach()
    endforeach()
endfunction()
