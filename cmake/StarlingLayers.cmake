# The libraries in layers, lowest first. A library may link only libraries of lower layers, so the
# dependency direction README.md draws holds by construction: configuring fails, naming both, when
# a library links one of its own layer or above, and when a starling_* library is in no layer.
set(STARLING_LAYERS
    "starling_common starling_openblas starling_proto"
    "starling_model_layout starling_kernels_cuda"
    "starling_codec starling_kernels_nccl"
    "starling_kernels starling_peer"
    "starling_model starling_data"
    "starling_optimizer"
    "starling_engine"
    "starling_daemon starling_experiment"
    "starling_swarm"
    "starling_service starling_cli")

# What `target` links itself, privately or for its users.
function(starling_direct_links target out)
    set(links)
    foreach(property LINK_LIBRARIES INTERFACE_LINK_LIBRARIES)
        get_target_property(found ${target} ${property})
        if(found)
            list(APPEND links ${found})
        endif()
    endforeach()
    set(${out} ${links} PARENT_SCOPE)
endfunction()

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
            starling_direct_links(${target} links)
            foreach(link IN LISTS links)
                if(DEFINED layer_of_${link} AND NOT layer_of_${link} LESS layer_of_${target})
                    message(FATAL_ERROR "${target} links ${link}, which is not below it "
                                        "(cmake/StarlingLayers.cmake, README.md's layout)")
                endif()
            endforeach()
        endforeach()
    endforeach()
endfunction()

# The libraries a node needs to talk to its peers stay free of the compute stack: the codecs and
# the peer layer link neither BLAS nor CUDA, directly or through anything they link.
set(STARLING_NO_COMPUTE starling_codec starling_peer)
set(STARLING_COMPUTE starling_kernels starling_kernels_cuda starling_kernels_nccl starling_openblas
                     CUDA::cudart CUDA::cublas)

# The names of everything `target` links, through targets it links, to any depth.
function(starling_link_closure target out)
    set(seen)
    set(pending ${target})
    while(pending)
        list(POP_FRONT pending current)
        if(current IN_LIST seen OR NOT TARGET ${current})
            continue()
        endif()
        list(APPEND seen ${current})
        starling_direct_links(${current} links)
        list(APPEND pending ${links})
    endwhile()
    set(${out} ${seen} PARENT_SCOPE)
endfunction()

function(starling_check_no_compute)
    foreach(library IN LISTS STARLING_NO_COMPUTE)
        starling_link_closure(${library} closure)
        foreach(compute IN LISTS STARLING_COMPUTE)
            if(compute IN_LIST closure)
                message(FATAL_ERROR "${library} links ${compute} (through its dependencies): the "
                                    "codecs and the peer layer must not link BLAS or CUDA "
                                    "(cmake/StarlingLayers.cmake)")
            endif()
        endforeach()
    endforeach()
endfunction()
